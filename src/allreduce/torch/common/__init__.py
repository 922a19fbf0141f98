"""What the torch rooms share: tensors in host memory, the torch dtype table, compression and the
reduction of one flat buffer through a compressor."""
