"""ImageNet from image-net.org's archives to the root `train_vit.py data.root=...` reads:
horst_sparse.vit.prepare_imagenet.main (its --help says what it does)."""

from horst_sparse.vit.prepare_imagenet import main

if __name__ == "__main__":
    main()
