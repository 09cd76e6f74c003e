"""/dev/char/MAJ:MIN links of the nodes gpuhook injects (gpuhook/install/devlinks.py), under fake host
roots with real char nodes (root: mknod), made by `gpuhook install` and by the agent."""

from __future__ import annotations

import io
import json
import os

import pytest

from conftest import gpuhook, is_root
from gpuhook.agent import core as agent_mod
from gpuhook import log
from gpuhook.install import devlinks
from fakes import fakehost
from gpuhook.probe import probe

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: real char nodes (mknod)")


def links_of(root: str) -> dict[str, str]:
    d = os.path.join(root, "dev", "char")
    return {n: os.readlink(os.path.join(d, n)) for n in sorted(os.listdir(d))} if os.path.isdir(d) else {}


def test_every_injected_node_that_exists_gets_its_relative_link(make_host):
    root = make_host("nvidia", mknod=True)
    os.unlink(os.path.join(root, "dev", "nvidia-uvm-tools"))  # made lazily by the driver: not there yet
    links = devlinks.ensure(root, probe(root))
    assert {x.status for x in links} == {"made"}
    found = links_of(root)
    for minor in range(8):
        assert found[f"195:{minor}"] == f"../nvidia{minor}"
    assert found["195:255"] == "../nvidiactl" and found["510:0"] == "../nvidia-uvm"
    assert "510:1" not in found
    # every link leads to the node of its numbers, inside the host root
    for name, target in found.items():
        st = os.stat(os.path.join(root, "dev", "char", name))
        assert f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" == name
        assert os.path.realpath(os.path.join(root, "dev", "char", name)).startswith(root + "/dev/")
    # the same again: nothing made, nothing touched
    before = {n: os.lstat(os.path.join(root, "dev", "char", n)).st_ino for n in found}
    again = devlinks.ensure(root, probe(root))
    assert {x.status for x in again} == {"there"}
    assert {n: os.lstat(os.path.join(root, "dev", "char", n)).st_ino for n in found} == before


def test_nodes_in_subdirectories_and_other_vendors(tmp_path):
    fh = fakehost.FakeHost(str(tmp_path / "amd"), mknod=True)
    fakehost.amd(fh, gpus=2)
    devlinks.ensure(fh.root, probe(fh.root))
    found = links_of(fh.root)
    assert found["235:0"] == "../kfd"
    assert found["226:128"] == "../dri/renderD128" and found["226:129"] == "../dri/renderD129"
    fh = fakehost.FakeHost(str(tmp_path / "nv"), mknod=True)
    fakehost.nvidia(fh, gpus=1, libs=False, imex_channels=2, nvswitch=1)
    devlinks.ensure(fh.root, probe(fh.root))
    found = links_of(fh.root)
    assert found["234:1"] == "../nvidia-caps-imex-channels/channel1"
    assert found["511:0"] == "../nvidia-nvswitch0"


def test_an_existing_name_is_never_replaced(make_host):
    root = make_host("nvidia", mknod=True, gpus=3, libs=False)
    char = os.path.join(root, "dev", "char")
    os.makedirs(char)
    os.symlink("../somewhere-else", os.path.join(char, "195:0"))   # someone's link, even a wrong one
    os.symlink("/dev/nvidia1", os.path.join(char, "195:1"))        # an absolute one (udev's own style differs)
    with open(os.path.join(char, "195:2"), "w") as f:              # not even a link
        f.write("x")
    links = {x.path: x.status for x in devlinks.ensure(root, probe(root))}
    assert links["/dev/char/195:0"] == links["/dev/char/195:1"] == links["/dev/char/195:2"] == "there"
    assert links["/dev/char/195:255"] == "made"
    assert os.readlink(os.path.join(char, "195:0")) == "../somewhere-else"
    assert os.readlink(os.path.join(char, "195:1")) == "/dev/nvidia1"
    assert open(os.path.join(char, "195:2")).read() == "x"


def test_a_dev_char_that_is_not_a_directory_is_left_alone(make_host, tmp_path):
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(str(elsewhere), os.path.join(root, "dev", "char"))
    links = devlinks.ensure(root, probe(root))
    assert links and all(x.status == "error: /dev/char is not a directory" for x in links)
    assert os.listdir(elsewhere) == []
    assert "failed" in devlinks.summary(links)


def test_dry_run_and_a_cpu_only_node_make_nothing(make_host):
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    links = devlinks.ensure(root, probe(root), dry_run=True)
    assert links and {x.status for x in links} == {"would be made"}
    assert not os.path.exists(os.path.join(root, "dev", "char"))
    cpu = make_host("cpu")
    assert devlinks.ensure(cpu, probe(cpu)) == []
    assert not os.path.exists(os.path.join(cpu, "dev", "char"))


def test_install_makes_them_and_uninstall_leaves_them(make_host, tmp_path):
    root = make_host("nvidia", mknod=True, gpus=2, libs=False)
    os.makedirs(os.path.join(root, "etc", "containerd"))
    with open(os.path.join(root, "etc", "containerd", "config.toml"), "w") as f:
        f.write("version = 2\n")
    b = tmp_path / "bundle"
    (b / "bin").mkdir(parents=True)
    (b / "bin" / "gpuhook-runtime").write_text("#!/bin/sh\n")
    (b / "gpuhook-bundle.json").write_text(json.dumps({"files": ["bin/gpuhook-runtime", "gpuhook-bundle.json"]}))
    r = gpuhook("install", "--host-root", root, "--runtime", "containerd", "--bundle-dir", b, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dev links (/dev/char, for the systemd cgroup driver): 5 would be made (" in r.stdout, r.stdout
    assert links_of(root) == {}
    r = gpuhook("install", "--host-root", root, "--runtime", "containerd", "--bundle-dir", b)
    assert r.returncode == 0, r.stderr
    assert "5 made (/dev/char/195:255 -> ../nvidiactl, " in r.stdout, r.stdout
    want = {"195:0": "../nvidia0", "195:1": "../nvidia1", "195:255": "../nvidiactl", "510:0": "../nvidia-uvm",
            "510:1": "../nvidia-uvm-tools"}
    assert links_of(root) == want
    r = gpuhook("install", "--host-root", root, "--runtime", "containerd", "--bundle-dir", b)
    assert "0 made, 5 already there" in r.stdout, r.stdout
    r = gpuhook("uninstall", "--host-root", root, "--runtime", "containerd")
    assert r.returncode == 0, r.stderr
    assert links_of(root) == want  # correct whoever made them


def test_the_agent_makes_them_on_each_probe(tmp_path):
    out = io.StringIO()
    log.configure(stream=out, fmt="json", level="debug")
    try:
        fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=True)
        fakehost.nvidia(fh, gpus=1, libs=False, uvm_node=False)
        a = agent_mod.Agent(agent_mod.Options(root=fh.root, spec_root=fh.root, cdi_dir="", nfd_dir="", install=False,
                                              udev=False, ready_file="", ldconfig="/sbin/ldconfig"),
                            log=log.get(), kube=None)
        assert a.sync("start")
        assert links_of(fh.root) == {"195:0": "../nvidia0", "195:255": "../nvidiactl"}
        fh.chardev("/dev/nvidia-uvm", 510, 0)  # the driver made its node later
        fh.chardev("/dev/nvidia1", fakehost.NVIDIA_MAJOR, 1)
        assert a.sync("timer")
        assert links_of(fh.root)["510:0"] == "../nvidia-uvm"
        assert "195:1" not in links_of(fh.root)  # a node no GPU of the probe has: gpuhook never injects it
        made = [json.loads(line) for line in out.getvalue().splitlines() if '"devlinks.made"' in line]
        assert [m["links"] for m in made] == [["/dev/char/195:255 -> ../nvidiactl", "/dev/char/195:0 -> ../nvidia0"],
                                              ["/dev/char/510:0 -> ../nvidia-uvm"]]
    finally:
        log.configure(stream=io.StringIO(), fmt="json")


def test_a_block_node_gets_its_dev_block_link(tmp_path):
    from gpuhook.inventory import Inventory, Node, VendorInventory

    root = tmp_path / "host"
    (root / "dev" / "sub").mkdir(parents=True)
    os.mknod(root / "dev" / "sub" / "blk0", 0o060600, os.makedev(7, 99))
    os.mknod(root / "dev" / "chr0", 0o020600, os.makedev(240, 3))
    (root / "dev" / "plain").write_text("")
    nodes = (Node("/dev/sub/blk0", "b", 7, 99), Node("/dev/chr0", "c", 240, 3), Node("/dev/plain", "c", 1, 1),
             Node("/dev/missing", "c", 240, 4, present=False))
    inv = Inventory(str(root), (VendorInventory("accel", (), nodes),))
    links = {x.path: (x.target, x.status) for x in devlinks.ensure(str(root), inv)}
    assert links == {"/dev/block/7:99": ("../sub/blk0", "made"), "/dev/char/240:3": ("../chr0", "made")}
    assert os.readlink(root / "dev" / "block" / "7:99") == "../sub/blk0"
    assert os.stat(root / "dev" / "block" / "7:99").st_rdev == os.makedev(7, 99)
