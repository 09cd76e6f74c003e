"""pydantic models for what crosses a boundary to people and tools: `probe --json` output.

Kept off the per-container path (pydantic costs ~100 ms to import there).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeModel(_Strict):
    path: str = Field(pattern=r"^/dev/")
    type: str = Field(pattern=r"^[cb]$")
    major: int = Field(ge=0)
    minor: int = Field(ge=0)
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    present: bool = True


class DeviceModel(_Strict):
    vendor: str
    kind: str
    index: int = Field(ge=0)
    id: str
    pci: str | None = None
    model: str | None = None
    driver: str | None = None
    parent: str | None = None
    nodes: list[NodeModel]


class LibraryModel(_Strict):
    path: str
    soname: str | None
    capability: str


class VendorModel(_Strict):
    vendor: str
    driver_version: str | None
    devices: list[DeviceModel]
    control_nodes: list[NodeModel]
    libraries: list[LibraryModel]
    binaries: list[str]
    driver_root: str | None = None
    mount_map: list[tuple[str, str]] = []


class InventoryModel(_Strict):
    """Schema of `gpuhook probe --json`."""

    root: str
    vendors: list[VendorModel]
    warnings: list[str]
