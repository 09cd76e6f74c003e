"""WSL2: the paravirtualized GPU /dev/dxg and the user-space libraries in /usr/lib/wsl/lib.

The major is /proc/devices "dxg", else the node's own (a real char device); an empty file with
no known major is skipped with a warning. Every shared library (a name with ".so") in
/usr/lib/wsl/lib (libdxcore.so, libd3d12.so, libcuda.so...) is reported as a compute library;
other files there (nvidia-smi) and the driver store (/usr/lib/wsl/drivers) are not reported.
"""

import stat as _stat

from .. import defaults, vendors
from ..inventory import Device, Library, VendorInventory
from .common import char_majors, device_node, first_major
from .host import Host

VENDOR = vendors.by_module(__name__).name  # this probe's vendor, as the registry names it

LIB_DIR = defaults.WSL_LIB_DIR


def probe(host: Host) -> VendorInventory | None:
    major = first_major(char_majors(host), "dxg")
    node = device_node(host, "/dev/dxg", major, 0 if major is not None else None)
    if node is None:
        return None
    libraries = []
    for name in host.listdir(LIB_DIR):
        st = host.stat(f"{LIB_DIR}/{name}")
        if ".so" in name and st is not None and _stat.S_ISREG(st.st_mode):
            libraries.append(Library(f"{LIB_DIR}/{name}", None, "compute"))
    device = Device(VENDOR, "dxg", 0, "dxg", (node,), None, "WSL2 GPU (dxg)", "dxgkrnl")
    return VendorInventory(VENDOR, (device,), (), tuple(libraries))
