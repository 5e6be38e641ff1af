"""gpulab.cache"""
