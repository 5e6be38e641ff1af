"""gpulab.serving"""
