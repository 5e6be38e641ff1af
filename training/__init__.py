"""gpulab.training"""
