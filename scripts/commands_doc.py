"""Write docs/commands.md from the command registry: python scripts/commands_doc.py"""

from pathlib import Path

from parcel_hpc.cli import commands_markdown

if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "commands.md"
    out.write_text(commands_markdown())
    print(f"wrote {out}")
