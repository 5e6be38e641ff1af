"""gpulab.backend"""
