"""PreWorld's pure tensor functions: volume rendering with scene contraction, its 2D and 3D losses, lift-splat
voxel pooling, and the occupancy metrics' helpers. Every vectorised path has a readable twin in ``naive.py``."""
