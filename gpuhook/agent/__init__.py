"""The node agent (`gpuhook agent`, the DaemonSet's process): core.py runs it (install, probe,
CDI specs, readiness); labels.py (node labels, the NFD feature file), podevents.py (pod Events
from the runtime's log), metrics.py (Prometheus) and kube.py (the Kubernetes API client) serve
it. Importing this package loads none of them."""
