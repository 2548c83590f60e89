"""Simulation: LIBERO environment wrapper, scripted expert and demonstration recorder (docs/design.md §9).

Importing this package (or `libero_env`, `expert`, `recorder`) never imports LIBERO, MuJoCo or
h5py; they are imported when an environment is built or a file is written.
"""
