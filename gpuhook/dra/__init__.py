"""`gpuhook dra`: gpuhook's DRA driver for the kubelet (resource.k8s.io/v1).

- slices.py: the node's Inventory -> the devices of its ResourceSlices (pure): every GPU the
  probe found, of any vendor, and one `none` device that may be allocated any number of times.
- driver.py: the kubelet plugin: its registration (pluginregistration v1) and the DRA gRPC
  service (v1.DRAPlugin), prepare giving CDI ids of gpuhook's own CDI specs (cdi.py), the
  prepared claims in a checkpoint file that a restart keeps.
- dra_pb2*.py / pluginregistration_pb2*.py: protoc's, from the kubelet's .proto files
  beside them (regen.py); podresources_pb2*.py too, the agent's client of the kubelet's
  pod-resources API (agent/podres.py).

See docs/dra.md.
"""

DRIVER = "gpuhook.dev"  # the driver's name: ResourceSlices' spec.driver, the kubelet plugin's name
PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"  # where the kubelet watches for registration sockets
PLUGINS_DIR = "/var/lib/kubelet/plugins"  # <dir>/<driver>/: the driver's own socket and checkpoint
