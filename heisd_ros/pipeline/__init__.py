"""The offline pipeline, ROS-free: demonstration episodes, training, database points, calibration.

Everything the `heisd` tools do between a user's recordings and the files the node loads (model,
drafter, database, calibration) lives here; the tools are thin command lines over it.
"""
