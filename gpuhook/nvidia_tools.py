"""The NVIDIA driver capability each NVIDIA tool serves (NVIDIA_DRIVER_CAPABILITIES).

One table for the probe (which tools to look for) and the planner (which to mount for the
capabilities a container asks for). Its own tiny module: a create whose probe result comes
from the cache plans without importing the probe.
"""

NVIDIA_TOOLS = {
    "nvidia-smi": "utility",
    "nvidia-debugdump": "utility",
    "nvidia-persistenced": "utility",
    "nvidia-cuda-mps-control": "compute",
    "nvidia-cuda-mps-server": "compute",
    "nvidia-ngx-updater": "ngx",
}
