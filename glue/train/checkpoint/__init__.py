"""Checkpoints: the Checkpointer, its on-target format, the commit protocol, restore and fencing.

One file per role: `checkpointer` (the public object), `snapshot` (host copy on the training thread),
`commit` (the background save, step by step), `format` (the objects, COMMIT.json, validation),
`load` (objects to component states), `invalid` (what restore does with unusable checkpoints),
`fence` (a replaced attempt never commits), `exit_hooks` (a pending save survives process exit),
`check` (`python -m glue.train.checkpoint.check`, run on a VM by `glue recover`).
"""
