"""The user's own job on the controller side: their workdir packed, pinned and shipped to the bucket.

select.py  which files ship (.gitignore, .gpukitignore, secret-looking files refused)
pack.py    the deterministic tar and its sha256; the size cap
gitinfo.py the user's repository: commit, dirty flag, a hash of the uncommitted diff
ship.py    the package uploaded once under its content address
pin.py     what a run's manifest pins (package + resolved requirements) and hands each VM
command.py the run's command checked against the package, before any VM work
"""
