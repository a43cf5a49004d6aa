"""Engines: the contract every engine implements and the engines shipped with cudnn_graph."""
