"""The node config as a pydantic model, for `gpuhook config check` (people, CI, the installer).

The runtime never imports this (pydantic costs ~100 ms there): it reads the same keys with
config.py's small reader. Both must agree on what is valid; tests/unit/test_policy_config.py
holds them to it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, field_validator

from .config import (
    FAIL_MODES,
    NVIDIA_DRIVER_ROOT_AUTO,
    RESERVED_LABEL_DOMAINS,
    SHARE_MODES,
    Config,
    is_clean_abspath,
    valid_driver_root,
    valid_vendor_label,
)

# the defaults are the fast reader's (config.Config): written once, there
_D = Config._defaults


class ConfigModel(BaseModel):
    """/etc/gpuhook/config.toml. Every key is optional; a missing key means its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: StrictStr | None = Field(_D["runtime"], description="the real OCI runtime: a name on PATH or a path")
    host_root: StrictStr = Field(_D["host_root"], description="where the node's / is")
    log_file: StrictStr = Field(_D["log_file"], description='one JSON line per create; "" turns it off')
    fail_mode: Literal[FAIL_MODES] = Field(  # type: ignore[valid-type]
        _D["fail_mode"], description="what a gpuhook error does to the create"
    )
    ldconfig: StrictStr | None = Field(_D["ldconfig"], description="the node's ldconfig for the ld-cache hook")
    probe_cache_ttl: StrictInt | StrictFloat = Field(
        _D["probe_cache_ttl"], ge=0, description="seconds a probe result is reused; 0 disables"
    )
    share: Literal[SHARE_MODES] = Field(  # type: ignore[valid-type]
        _D["share"],
        description="unallocated: GPUs the kubelet allocated to other pods are never given; "
        "all: every GPU, allocated or not",
    )
    mps_pipe_dir: StrictStr = Field(
        _D["mps_pipe_dir"], description='the NVIDIA MPS control daemon\'s pipe directory ("": no MPS)'
    )
    nvidia_driver_root: StrictStr = Field(
        _D["nvidia_driver_root"],
        description='where the NVIDIA driver\'s userspace is: "auto" (the host, '
        "/run/nvidia/driver, /home/kubernetes/bin/nvidia) or one node path",
    )
    vendor_label: StrictStr = Field(
        _D["vendor_label"],
        description="the node label the agent sets to the primary vendor (as gpuhook.dev/accelerator), "
        'for the nodeAffinity users already write; "" turns it off',
    )
    nri_runtime_handler: StrictStr = Field(
        _D["nri_runtime_handler"], min_length=1, description="the runtime handler whose pods `gpuhook nri` adjusts"
    )

    @field_validator("*")
    @classmethod
    def _no_nul_or_infinity(cls, v):
        if isinstance(v, str) and "\0" in v:  # no path or name holds one; os.* raise on it
            raise ValueError("contains a NUL character")
        if isinstance(v, float) and not abs(v) < float("inf"):  # TOML has nan and inf
            raise ValueError(f"{v} is not a finite number")
        return v

    @field_validator("host_root")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path")
        return v

    @field_validator("nvidia_driver_root")
    @classmethod
    def _driver_root(cls, v: str) -> str:
        if not valid_driver_root(v):
            raise ValueError(
                f'must be "{NVIDIA_DRIVER_ROOT_AUTO}", "/" or a normal absolute path '
                "(no '.', '..', '//' or trailing '/')"
            )
        return v

    @field_validator("vendor_label")
    @classmethod
    def _vendor_label(cls, v: str) -> str:
        if not valid_vendor_label(v):
            raise ValueError(
                '"" or a label key ([prefix/]name: a DNS subdomain, then 1 to 63 of [A-Za-z0-9._-]), '
                f"not under {', '.join(RESERVED_LABEL_DOMAINS)}"
            )
        return v

    @field_validator("mps_pipe_dir")
    @classmethod
    def _clean(cls, v: str) -> str:
        if v and not is_clean_abspath(v):
            raise ValueError("must be \"\" or a normal absolute path (no '.', '..', '//' or trailing '/'), not '/'")
        return v


def check(text: str) -> list[str]:
    """Every problem of a config file's text, one line each as "key: what is wrong"; [] when valid."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return [f"invalid TOML: {e}"]
    try:
        ConfigModel.model_validate(data)
    except ValidationError as e:
        out = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(file)"
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            else:
                msg = f"{err['msg'].removeprefix('Value error, ')} (got {err['input']!r})"
            out.append(f"{key}: {' '.join(str(msg).split())}")
        return out
    return []
