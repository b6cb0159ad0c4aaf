"""Each service class is its tier's gRPC servicer and nothing else (issue 45): the round loop is a driver
(cloud_server/driver.py), the edge's upward link a client (edge_server/cloud_link.py), an edge attempt one object
(edge_server/attempt.py), device phases registered handlers (device_client/phases.py). This keeps them small."""
import ast

import pytest

from .test_modes import ROOT, SERVICES

CLASSES = {"cloud_server/service.py": ["CloudServer"], "edge_server/service.py": ["EdgeServer"],
           "device_client/host.py": ["Device", "DeviceHost"]}


def _attributes(cls: ast.ClassDef) -> set[str]:
    out = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return out


@pytest.mark.parametrize("path", SERVICES)
def test_a_service_is_under_300_lines_20_attributes_and_60_lines_a_method(path):
    text = (ROOT / path).read_text()
    assert len(text.splitlines()) < 300
    tree = ast.parse(text)
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    for name in CLASSES[path]:
        assert len(_attributes(classes[name])) < 20, name
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert long == []
