"""``python -m tools.diagrams``: regenerate every diagram and the manifest."""

from . import OUT, write

if __name__ == "__main__":
    names = write()
    print(f"wrote {len(names)} files to {OUT}")
