"""gpulab.telemetry"""
