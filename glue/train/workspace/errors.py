"""The one error the workspace step raises: its message is the line the user sees."""


class WorkspaceError(Exception):
    """The code or the requirements cannot be made ready on this VM (one line: what and how to fix it)."""
