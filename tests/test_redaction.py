"""The one redaction module (prompt_r1.core.redaction) on its own; every surface's use of it is tested with the surface."""

from __future__ import annotations

import json


def test_the_redactor_cuts_every_key_also_json_escaped():
    from prompt_r1.core.redaction import Redactor

    redact = Redactor(["sk-short", "sk-short-and-longer", 'odd"key\\1', "EMPTY", ""])
    assert redact("a sk-short-and-longer b sk-short c EMPTY") == "a *** b *** c EMPTY"
    line = redact.json_line({"error": 'echo: odd"key\\1 and sk-short'})
    assert json.loads(line) == {"error": "echo: *** and ***"}
