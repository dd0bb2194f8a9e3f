"""What a local VM's console says of its first boot: the host key, a failure that ends the wait at once (the
image's first-boot script's own error, systemd's status line for its unit, a guest kernel's panic), and the
last lines a boot-failure message carries."""

from __future__ import annotations

from glue.cloud import boot_console

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0a3J1bm5pbmcgb3V0IG9mIGtleXMgaGVyZQ"


def test_the_host_key_and_the_failures_a_console_shows() -> None:
    assert boot_console.host_key(f"booting\ngpukit-hostkey: {KEY}\n") == KEY
    assert boot_console.host_key("booting\n") is None and boot_console.failure("booting\n") is None
    assert boot_console.failure("x\ngpukit-firstboot: no seed found\n") == "gpukit-firstboot: no seed found"
    said = "[FAILED] Failed to start gpukit-firstboot.service - gpukit first boot: identity from the seed."
    assert boot_console.failure(f"ok\n{said}\nmore\n") == said
    panic = "[  3.1] Kernel panic - not syncing: VFS"
    assert boot_console.failure(f"{panic}\n") == panic


def test_the_tail_is_the_last_non_empty_lines_on_one_line() -> None:
    assert boot_console.tail("a\n\nb\nc\n\nd\n") == "b | c | d"
    assert boot_console.tail("") == "(empty)"
