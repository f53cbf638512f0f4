# Cells 14, 16 and 18 of facebookresearch/dinov3 notebooks/pca.ipynb (commit 6876159),
# verbatim; see README.md. Each "# %% cell N" line starts one cell.

# %% cell 14
foreground_selection = fg_score_mf.view(-1) > 0.5
fg_patches = x[foreground_selection]

# %% cell 16
pca = PCA(n_components=3, whiten=True)
pca.fit(fg_patches)

# %% cell 18
# apply the PCA, and then reshape
projected_image = torch.from_numpy(pca.transform(x.numpy())).view(h_patches, w_patches, 3)

# multiply by 2.0 and pass through a sigmoid to get vibrant colors 
projected_image = torch.nn.functional.sigmoid(projected_image.mul(2.0)).permute(2, 0, 1)

# mask the background using the fg_score_mf
projected_image *= (fg_score_mf.unsqueeze(0) > 0.5)

# enjoy
plt.figure(dpi=300)
plt.imshow(projected_image.permute(1, 2, 0))
plt.axis('off')
plt.show()
