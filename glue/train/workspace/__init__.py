"""The user's job on the VM: their code package and their requirements, both pinned in the bucket.

    python -m glue.train.workspace prepare SPEC   # every attempt, every node: code + venv, checked
    python -m glue.train.workspace target         # the first deploy: what this VM installs (tags, image)

Light on purpose (no torch): `glue deploy` and `glue recover` run it over SSH before the trainer
starts, and the controller imports `keys` for the bucket names. docs/design.md, "Your own job".
"""
