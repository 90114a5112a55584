"""nnU-Net trainer variants shipped as package data; nnU-Net finds them through ``nnUNet_extTrainer``."""
