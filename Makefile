# Standalone (venv) workflow: `make setup` installs the node (heisd_ros) and the LIBERO workbench
# beside it (heisd_libero) into .venv, editable; docs/install.md also covers the ROS 2 workspace build.
VENV := .venv

.PHONY: setup test demo bench

setup:
	bash scripts/setup_venv.sh

test: setup
	$(VENV)/bin/python -m pytest -q test

demo: setup
	$(VENV)/bin/heisd-libero sim-demo

bench: setup
	$(VENV)/bin/heisd bench --model tiny
