"""gpulab.hub_ext"""
