"""How a stand-in presents itself: ABI, properties, authorization, files the phone already has."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

ABI_LISTS = {
    "x86_64": "x86_64,x86",
    "arm64-v8a": "arm64-v8a,armeabi-v7a,armeabi",
}
GPU_LIBS = ("/vendor/lib64/libOpenCL.so", "/vendor/lib64/libvulkan.so", "/system/lib64/libvulkan.so")


@dataclass
class StandInConfig:
    """Everything the device process needs; written as JSON by the launcher."""

    sandbox: str
    state: str
    abi: str = "x86_64"  # "x86_64" runs host binaries; "arm64-v8a" runs aarch64 ELF files under qemu
    auth: str = "accept"  # "reject": answer CNXN with AUTH and never accept (adb shows "unauthorized")
    mode: str = "device"  # "offline": accept the TCP connection but never finish the handshake
    props: dict[str, str] = field(default_factory=dict)
    gpu_libs: list[str] = field(default_factory=lambda: list(GPU_LIBS))
    gles: str = ""  # what `dumpsys SurfaceFlinger` reports as GLES ("" = nothing)
    qemu: str = "qemu-aarch64"
    qemu_cpu: str = "max"
    qemu_ld_prefix: str = ""  # -L for dynamically linked aarch64 programs (static ones need none)
    name: str = "standin"
    link_bytes_per_s: float = 0.0  # > 0: the device-to-host link is throttled to this rate (a USB 2 cable: ~35e6)

    def full_props(self, port: int) -> dict[str, str]:
        """Default Android properties for this ABI, overridden by `props`."""
        base = {
            "ro.product.model": f"StandIn {self.abi}",
            "ro.product.name": self.name,
            "ro.product.device": self.name,
            "ro.product.manufacturer": "layerdiff",
            "ro.product.brand": "layerdiff",
            "ro.product.cpu.abi": self.abi,
            "ro.product.cpu.abilist": ABI_LISTS.get(self.abi, self.abi),
            "ro.board.platform": "standin",
            "ro.soc.manufacturer": "layerdiff",
            "ro.soc.model": f"standin-{self.abi}",
            "ro.hardware": "standin",
            "ro.build.version.release": "14",
            "ro.build.version.sdk": "34",
            "ro.serialno": f"standin{port}",
        }
        base.update(self.props)
        return base

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "StandInConfig":
        return cls(**json.loads(text))
