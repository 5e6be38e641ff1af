"""gpulab.client"""
