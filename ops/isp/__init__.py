"""Camera-pipeline ops of BracketIRE (Zhang et al., ICLR 2025): pure tensor functions, no ``nn.Parameter``.

* :mod:`ops.isp.simulate` -- sRGB (de)linearisation, Brooks et al. unprocessing (CCM, white-balance gains with the
  safe inversion near white, RGGB mosaic), RGGB packing, ISO-1600 shot/read noise, 10-bit quantisation, the
  exposure-bracket synthesis (``4^n`` sub-frames averaged into exposure ``n``) with its naive twin, exposure
  normalisation and the x4 area downsampling of BracketIRE+.
* :mod:`ops.isp.motion` -- procedural camera / object motion per sub-frame (replaces the paper's video frame
  interpolation) and the oracle flow it implies.
* :mod:`ops.isp.process` -- RAW -> linear sRGB (white balance, half-resolution demosaic, CCM) and the mu-law tone map.
* :mod:`ops.isp.losses` -- the mu-law L1 loss, the temporally unbalanced self-supervised loss, the EMA update.
* :mod:`ops.isp.deform` -- flow warping and a readable modulated deformable convolution, the naive twin of
  ``torchvision.ops.deform_conv2d``.
"""
