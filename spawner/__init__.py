"""gpulab.spawner"""
