"""python -m tests.lyceum_emulator --port 8765 --home /tmp/lyceum-emu

Serves until interrupted, then destroys every VM it created. The API key is written to
<home>/api_key (0600); point the kit at it with
    export LYCEUM_API_URL=http://127.0.0.1:8765/api/v2/external LYCEUM_API_KEY=$(cat <home>/api_key)
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from glue.paths import write_secret

from .server import Emulator


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.lyceum_emulator", description="Lyceum API emulator")
    ap.add_argument("--port", type=int, default=0, help="API port on 127.0.0.1 (default: any free one)")
    ap.add_argument("--home", type=Path, required=True, help="state directory (local VMs, bucket data)")
    ap.add_argument("--pending-seconds", type=float, default=2.0, help="how long a new VM stays pending")
    ap.add_argument("--credentials-ttl", type=float, default=900.0, help="lifetime of storage credentials (s)")
    ap.add_argument("--no-boot", action="store_true", help="do not boot local VMs (API shapes only)")
    ap.add_argument("--login-user", default="root",
                    help="the image's user: root, or e.g. ubuntu (passwordless sudo, root login disabled)")
    ap.add_argument("--instance-specs", choices=["current", "legacy"], default=None,
                    help="accept only this instance_specs shape (422 for the other); default: both")
    ap.add_argument("--availability", choices=["profiles", "variants"], default="profiles",
                    help="the GET /vms/availability answer's shape")
    args = ap.parse_args()
    emu = Emulator(args.home.resolve(), pending_s=args.pending_seconds, credentials_ttl=args.credentials_ttl,
                   boot_vms=not args.no_boot, port=args.port, login_user=args.login_user)
    emu.specs_shape, emu.availability_shape = args.instance_specs, args.availability
    emu.start()
    write_secret(emu.home / "api_key", emu.api_key + "\n")
    print(f"lyceum emulator: {emu.url} (API key in {emu.home / 'api_key'})", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    emu.stop()


if __name__ == "__main__":
    main()
