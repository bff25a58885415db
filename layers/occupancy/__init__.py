"""3D occupancy networks: camera-to-voxel lifting, attribute heads and the occupancy world model (PreWorld)."""
