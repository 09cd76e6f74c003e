"""Compute accelerators of the kernel's accel subsystem: /dev/accel/accel<N>.

Sources: /sys/class/accel/accel<N> (`dev` file, `device` link to the PCI function and its
driver) and /dev/accel/accel<N>. The major is /proc/devices "accel", else the fixed 261; the
minor is N unless the `dev` file says otherwise. A node sysfs lists but /dev lacks is reported
with present=False. id = PCI address when known, else the node name.
"""

from .. import vendors
from ..inventory import Device, VendorInventory
from .common import char_majors, device_node, first_major, numbered_names, parse_dev, read_hex, uevent

from .host import Host

VENDOR = vendors.by_module(__name__).name  # this probe's vendor, as the registry names it

ACCEL_MAJOR = 261
CLASS_DIR = "/sys/class/accel"


def _numbers(host: Host, path: str) -> list[int]:
    return [n for n, _ in numbered_names(host.listdir(path), "accel")]


def probe(host: Host) -> VendorInventory | None:
    major = first_major(char_majors(host), "accel") or ACCEL_MAJOR
    in_sysfs = set(_numbers(host, CLASS_DIR))
    devices: list[Device] = []
    for n in sorted(in_sysfs | set(_numbers(host, "/dev/accel"))):
        sys_dir = f"{CLASS_DIR}/accel{n}"
        text = host.read_text(sys_dir + "/dev", quiet=True)
        numbers = parse_dev(text) if text is not None else None
        if text is not None and numbers is None:
            host.warn(f"{sys_dir}/dev: malformed {text.strip()[:40]!r}, using {major}:{n}")
        numbers = numbers or (major, n)
        node = device_node(host, f"/dev/accel/accel{n}", numbers[0], numbers[1], lazy=n in in_sysfs)
        if node is None:
            continue
        pci = driver = model = None
        if n in in_sysfs and host.is_dir(sys_dir + "/device"):
            dev_dir = host.realpath(sys_dir + "/device")
            ev = uevent(host, dev_dir + "/uevent")
            pci = ev.get("PCI_SLOT_NAME")
            target = host.readlink(dev_dir + "/driver")
            driver = target.rstrip("/").rpartition("/")[2] if target else ev.get("DRIVER")
            vendor, device = read_hex(host, dev_dir + "/vendor"), read_hex(host, dev_dir + "/device")
            if vendor is not None and device is not None:
                model = f"Accelerator {vendor:04x}:{device:04x}"
        devices.append(Device(VENDOR, "accel", len(devices), pci or f"accel{n}", (node,), pci, model, driver or None))
    return VendorInventory(VENDOR, tuple(devices)) if devices else None
