"""gpulab.widgets"""
