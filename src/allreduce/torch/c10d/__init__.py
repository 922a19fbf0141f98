"""The torch.distributed backend ``"allreduce"``: its registration, its collectives, the C++ shim
torch calls them through, and the private parts of torch it relies on."""
