"""gpulab.magics"""
