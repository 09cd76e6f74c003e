"""/dev/char/MAJ:MIN (and /dev/block/MAJ:MIN) links for the device nodes gpuhook injects.

Why: with the systemd cgroup driver (`SystemdCgroup = true`, kubeadm's default, and so the
gpu-optional handler's), runc hands systemd each device rule of a container as a
`/dev/char/MAJ:MIN` path, and leaves out the rules whose link does not exist; at the next
`systemctl daemon-reload` systemd re-applies only the rules it was given, and the container
loses its GPUs. udev makes these links for the nodes it makes, but NVIDIA's nodes are made by
nvidia-modprobe (or the driver's installer), not udev: they have none (NVIDIA's toolkit has
`nvidia-ctk system create-dev-char-symlinks` for the same reason).

`ensure(root, inv)` makes the missing links for every node gpuhook may inject that exists on
the host (under the host root `root`), as udev would: relative (`/dev/char/195:0 ->
../nvidia0`), named by the node's own numbers as the host has them. An existing name in
/dev/char is never replaced, whatever it is (a link is correct whoever made it, and a link
to another node is someone else's business): each link is made with one symlink(2) of the
final name, which is atomic (the name appears with its target, or not at all) and fails on
an existing name; a temp name renamed over it could replace a link made meanwhile.
Links are left in place by uninstall. `gpuhook install` makes them, and `gpuhook agent` on
each probe (nodes come and go with the driver).
"""

from __future__ import annotations

import os
import stat

KINDS = {stat.S_IFCHR: "char", stat.S_IFBLK: "block"}


class Link:
    """One link: its path (as on the node), its target, and what happened: made, there
    (the name existed: kept), would be made (dry run), or an error."""

    __slots__ = ("path", "target", "status")

    def __init__(self, path: str, target: str, status: str):
        self.path, self.target, self.status = path, target, status

    def __repr__(self) -> str:
        return f"Link({self.path!r} -> {self.target!r}: {self.status})"


def injected_paths(inv) -> list[str]:
    """The paths (as in the container, the same as on the node) of every device node gpuhook
    may inject on this node: the vendors' control nodes and devices' nodes, and what plan()
    gives a container that asks for every driver capability."""
    from ..config import Config
    from ..plan import Request, plan
    from ..probe import nodestate

    paths = []
    for v in inv.vendors:
        paths += [n.path for n in v.control_nodes]
        for d in v.devices:
            paths += [n.path for n in d.nodes]
    try:
        config = Config(log_file="")  # a dry plan: no container, no log
        state = nodestate.read(inv, config, ldconfig="/sbin/ldconfig")
        edits = plan(inv, state, Request({"NVIDIA_DRIVER_CAPABILITIES": "all"}, {}, None), config).edits
        paths += [n.path for n in edits.device_nodes]
    except Exception:  # the inventory's own nodes are still worth linking
        pass
    return list(dict.fromkeys(p for p in paths if p.startswith("/dev/") and "/../" not in p))


def ensure(root: str, inv, dry_run: bool = False) -> list[Link]:
    """Make the missing /dev/char and /dev/block links under `root`; what was found, each."""
    root = os.path.abspath(root)
    top = root.rstrip("/")
    out = []
    for path in injected_paths(inv):
        try:
            st = os.lstat(top + path)
        except OSError:
            continue  # made lazily by the driver (nvidia-uvm-tools...): nothing to link yet
        kind = KINDS.get(stat.S_IFMT(st.st_mode))
        if kind is None:
            continue
        link_dir = f"/dev/{kind}"
        link = f"{link_dir}/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        target = os.path.relpath(path, link_dir)
        out.append(_make(top, link_dir, link, target, dry_run))
    return out


def _make(top: str, link_dir: str, link: str, target: str, dry_run: bool) -> Link:
    d = top + link_dir
    try:
        dst = os.lstat(d)
    except FileNotFoundError:
        dst = None
    except OSError as e:
        return Link(link, target, f"error: {link_dir}: {e.strerror or e}")
    if dst is not None and not stat.S_ISDIR(dst.st_mode):
        return Link(link, target, f"error: {link_dir} is not a directory")
    if os.path.lexists(top + link):
        return Link(link, target, "there")
    if dry_run:
        return Link(link, target, "would be made")
    try:
        if dst is None:
            os.mkdir(d, 0o755)
        os.symlink(target, top + link)
    except FileExistsError:
        return Link(link, target, "there")  # made meanwhile (udev, another agent): kept
    except OSError as e:
        return Link(link, target, f"error: {e.strerror or e}")
    return Link(link, target, "made")


def summary(links: list[Link]) -> str:
    """One line for people: 'dev links: 3 made (/dev/char/195:0 -> ../nvidia0, ...), 9 already there'."""
    made = [f"{x.path} -> {x.target}" for x in links if x.status in ("made", "would be made")]
    there = sum(x.status == "there" for x in links)
    errors = [f"{x.path}: {x.status[7:]}" for x in links if x.status.startswith("error")]
    verb = "would be made" if any(x.status == "would be made" for x in links) else "made"
    parts = [f"{len(made)} {verb}" + (f" ({', '.join(made[:4])}{', ...' if len(made) > 4 else ''})" if made else "")]
    parts.append(f"{there} already there")
    if errors:
        parts.append(f"{len(errors)} failed ({'; '.join(errors[:3])})")
    return "dev links (/dev/char, for the systemd cgroup driver): " + ", ".join(parts)


def install_step(root: str, dry_run: bool, say) -> None:
    """`gpuhook install`'s step: probe the node, make the links, one line. Never fails the
    install (a read-only /dev costs the links, not the handler)."""
    from ..probe import probe

    try:
        links = ensure(root, probe(root), dry_run)
    except OSError as e:
        say(f"dev links: not made: {e.strerror or e}")
        return
    if links:
        say(summary(links))
