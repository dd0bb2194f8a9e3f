"""YAML a user wrote (run configs, image recipes): yaml.safe_load, except that a key given twice in one
mapping is an error. YAML keeps the last one without a word, so a config edited in two places would run
with whichever came last."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges are SafeLoader's business
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                line = first.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: SafeLoader says what is wrong with it
                continue
            if line != key_node.start_mark.line:
                raise ConstructorError(None, None, f"key {key!r} is given twice (first at line {line + 1}); "
                                       "keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """yaml.safe_load, refusing a mapping key given twice (a yaml.YAMLError with its line and column)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)
