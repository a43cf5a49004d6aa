"""Test-only DLPack producers (built from tests/producers/*.pyx, installed as cudnn_graph._testing)."""
