"""Attacks on what travels over the uplinks: gradient inversion (DLG, `dlg`) with its LeNet (`lenet`), scored by SSIM."""
