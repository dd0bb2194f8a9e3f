"""Ports for a group's stores, picked below the kernel's ephemeral range.

A port found free by binding port 0 comes from the ephemeral range and stays free only until the kernel
hands it to the machine's next outgoing connection or port-0 bind. torchrun's agent picks each round's
worker-store port that way seconds before rank 0 binds it; on VMs that share one network namespace
(the local backend) or on a busy host the port is taken meanwhile, and rank 0 dies "Address already in
use". The kernel never assigns a port below the range on its own, so a port picked there and found free
stays free unless another process binds exactly it. The group firewall (ansible/roles/group_firewall)
guards the range from half its low end up, which holds these ports and gloo's.
"""

from __future__ import annotations


def below_ephemeral(addr: str = "", range_file: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """A port in [low/2, low) of the ephemeral range that nothing on `addr` (every address when "") holds.
    Self-contained (its imports inside): glue runs its source on VMs whose python has no gpukit."""
    import random
    import socket

    try:
        with open(range_file) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    below = range(low // 2, low)
    for port in random.SystemRandom().sample(below, min(64, len(below))):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:  # every draw held: let the kernel pick
        s.bind((addr, 0))
        return int(s.getsockname()[1])
