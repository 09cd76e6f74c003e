"""plan.trusted.trusted_dir on host trees: how the node path of a directory gpuhook would mount
read-write (the MPS pipe directory) is resolved under a host root (links inside it, ".", "..")
and what on the way makes it refused."""

from __future__ import annotations

import os

import pytest

from gpuhook.plan.trusted import trusted_dir


def mps_host(tmp_path, name: str = "host"):
    """A host root `name` (its ancestors root's, as tmp_path's are) with an MPS directory at /run/mps."""
    root = tmp_path / name
    (root / "run" / "mps").mkdir(parents=True)
    (root / "run" / "mps" / "control").write_text("")
    for d in (tmp_path, root, root / "run", root / "run" / "mps"):
        os.chmod(d, 0o755)
    return root


@pytest.fixture
def host(tmp_path):
    return mps_host(tmp_path)


def test_the_directory_itself(host):
    assert trusted_dir(str(host), "/run/mps") == (f"{host}/run/mps", None)
    assert trusted_dir(str(host) + "/", "/run/mps") == (f"{host}/run/mps", None)  # a trailing / on the root


@pytest.mark.parametrize("path", ["/run/./mps", "/run//mps/", "run/mps", "/run/x/../mps", "/../run/mps",
                                  "/run/mps/."])
def test_dots_and_slashes_are_resolved_inside_the_root(host, path):
    (host / "run" / "x").mkdir(mode=0o755)
    assert trusted_dir(str(host), path) == (f"{host}/run/mps", None)


def test_root_links_absolute_and_relative_are_followed_inside_the_root(host):
    os.symlink("/run", host / "var-run")  # absolute: the host's /run, not the machine's
    os.symlink("../run/mps", host / "run" / "rel")
    os.symlink("./mps", host / "run" / "dot")
    assert trusted_dir(str(host), "/var-run/mps") == (f"{host}/run/mps", None)
    assert trusted_dir(str(host), "/run/rel") == (f"{host}/run/mps", None)
    assert trusted_dir(str(host), "/run/dot") == (f"{host}/run/mps", None)
    os.symlink("/run/mps", host / "abs")
    assert trusted_dir(str(host), "/abs") == (f"{host}/run/mps", None)
    (host / "opt").mkdir(mode=0o755)
    os.symlink("/run/mps", host / "opt" / "mps")  # absolute, from below the root: from the root again
    assert trusted_dir(str(host), "/opt/mps") == (f"{host}/run/mps", None)


def test_a_link_loop_is_refused(host):
    os.symlink("b", host / "a")
    os.symlink("a", host / "b")
    assert trusted_dir(str(host), "/a") == (None, "/a: too many links")


def test_forty_links_are_followed_and_the_41st_refused(host):
    os.symlink("run/mps", host / "l0")
    for i in range(1, 41):
        os.symlink(f"l{i - 1}", host / f"l{i}")
    assert trusted_dir(str(host), "/l39") == (f"{host}/run/mps", None)  # 40 links
    assert trusted_dir(str(host), "/l40") == (None, "/l40: too many links")


def test_a_users_link_is_refused_and_named(host):
    os.symlink("mps", host / "run" / "user-link")
    os.lchown(host / "run" / "user-link", 65534, 65534)
    assert trusted_dir(str(host), "/run/user-link") == (None, "/run/user-link: the link /run/user-link is owned by uid 65534, not root")


def test_what_is_refused_on_the_way_is_named(host):
    os.chmod(host / "run", 0o775)
    assert trusted_dir(str(host), "/run/mps") == (None, "/run/mps: /run is writable by group or others (mode 0775)")
    os.chmod(host / "run", 0o1777)  # sticky: as /tmp
    assert trusted_dir(str(host), "/run/mps") == (f"{host}/run/mps", None)
    os.chmod(host / "run" / "mps", 0o1777)  # the directory itself: never writable by others, sticky or not
    assert trusted_dir(str(host), "/run/mps") == (None, "/run/mps: /run/mps is writable by group or others (mode 1777)")
    os.chmod(host / "run" / "mps", 0o755)
    os.chown(host / "run", 65534, 65534)
    assert trusted_dir(str(host), "/run/mps") == (None, "/run/mps: /run is owned by uid 65534, not root")
    os.chown(host / "run", 0, 0)
    os.chown(host / "run" / "mps", 65534, 0)
    assert trusted_dir(str(host), "/run/mps") == (None, "/run/mps: /run/mps is owned by uid 65534, not root")


def test_the_host_roots_own_ancestors_are_checked(host, tmp_path):
    os.chmod(tmp_path, 0o777)
    assert trusted_dir(str(host), "/run/mps") == (
        None, f"/run/mps: the host root's {tmp_path} is writable by group or others (mode 0777)")
    os.chmod(tmp_path, 0o755)
    os.chown(host, 65534, 65534)
    assert trusted_dir(str(host), "/run/mps") == (None, f"/run/mps: the host root's {host} is owned by uid 65534, not root")


def test_no_directory_of_its_own(host):
    (host / "run" / "file").write_text("")
    assert trusted_dir(str(host), "/") == (None, "/: not a directory of its own")
    assert trusted_dir(str(host), "/..") == (None, "/..: not a directory of its own")
    assert trusted_dir(str(host), "/run/..") == (None, "/run/..: not a directory of its own")  # the root itself
    assert trusted_dir(str(host), "/run/none") == (None, "/run/none: not there")
    assert trusted_dir(str(host), "/run/file") == (None, "/run/file: /run/file is not a directory")
    assert trusted_dir(str(host), "/run/file/x") == (None, "/run/file/x: /run/file is not a directory")
    os.unlink(host / "run" / "mps" / "control")
    assert trusted_dir(str(host), "/run/mps") == (None, "/run/mps: no MPS control daemon there (no /run/mps/control)")


def test_the_nodes_own_root():
    """root "/": the node's own paths; a directory without the daemon's control entry."""
    real, why = trusted_dir("/", "/usr/lib")
    assert real is None and why == "/usr/lib: no MPS control daemon there (no /usr/lib/control)"
    assert trusted_dir("/", "/nonexistent-gpuhook") == (None, "/nonexistent-gpuhook: not there")


def test_a_host_root_whose_name_ends_in_x(tmp_path):
    root = mps_host(tmp_path, "hostX")
    assert trusted_dir(str(root), "/run/mps") == (f"{root}/run/mps", None)


def test_what_cannot_be_looked_at_is_one_line(tmp_path, host):
    assert trusted_dir(str(tmp_path / "none"), "/run/mps") == (None, "/run/mps: No such file or directory")
    # a path the kernel cannot be given: Python's own reason (its words vary by version: 3.11
    # "embedded null byte", 3.13 "lstat: embedded null character in path"), in the one line
    real, why = trusted_dir(str(host), "/run/m\0ps")
    assert real is None and why.startswith("/run/m\0ps: ") and "\n" not in why, why
    reason = why[len("/run/m\0ps: "):]
    assert "null" in reason and "Traceback" not in reason and "Error" not in reason, why
