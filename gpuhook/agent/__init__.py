"""The node agent (`gpuhook agent`, the DaemonSet's process): core.py runs it (install, probe,
CDI specs, readiness; watch.py wakes it, sinks.py and summary.py say what it found); labels.py
(node labels, the NFD feature file), follow.py (the runtime's log, tailed), events.py and
podevents.py (pod Events and labels from its lines), metrics.py (Prometheus), kubeclient.py
(the connection to the Kubernetes API) and kube.py (the calls made on it) serve it. Importing
this package loads none of them."""
