"""An mkdocs hook: ``<!-- settings: ExtractConfig -->`` in a page becomes the table of that config's settings,
generated from the fields' declarations (``reservoir.settings.setting``): name, option, default, rule, help."""

from __future__ import annotations

import re

MARKER = re.compile(r"<!-- settings: (\w+) -->")


def rule_text(rule) -> str:
    """A rule in words; a bound computed from other settings is named as such."""
    try:
        return rule.text()
    except (AttributeError, TypeError):
        return "bounded by the other settings (see the help)"


def table(name: str) -> str:
    import dataclasses

    from reservoir import config
    from reservoir.settings import shown_default

    cls = getattr(config, name)
    rows = ["| setting | option | default | rule | what it does |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        cli = f.metadata.get("cli", {})
        option = "" if cli.get("option") is False else cli.get("option") or f"--{f.name.replace('_', '-')}"
        if cli.get("argument"):
            option = f.name.upper()
        rules = " or ".join(rule_text(r) for r in f.metadata.get("rules", ()) if r is not None)
        default = shown_default(f) or (
            "required"
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            else ""
        )
        cells = [f"`{f.name}`", f"`{option}`" if option else "", default, rules, f.metadata.get("help", "")]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return MARKER.sub(lambda m: table(m.group(1)), markdown)
