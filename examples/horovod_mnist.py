"""A Horovod PyTorch MNIST training script, run by allreduce: the import line is the whole port.

It follows the structure of Horovod's ``examples/pytorch/pytorch_mnist.py`` (init, a
DistributedSampler per rank, the learning rate scaled by the number of ranks, parameters and optimizer
state broadcast from rank 0, DistributedOptimizer with optional fp16 compression or Adasum, metrics
averaged with ``hvd.allreduce``). The data are synthetic with MNIST's shape, so nothing is downloaded:
1x28x28 images of ten classes, each class a fixed random pattern plus noise (the same on every rank).

    allreduce run -n 2 -- python examples/horovod_mnist.py --epochs 2
    allreduce run -n 3 -- python examples/horovod_mnist.py --use-adasum

Rank 0 prints the training loss of the first logged batch and each epoch's mean, the test loss and
accuracy (averaged over ranks), and the samples per second of the whole job.
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import allreduce.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch MNIST example (synthetic data)")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size per rank for training")
parser.add_argument("--test-batch-size", type=int, default=1000, help="input batch size for testing")
parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one rank")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--log-interval", type=int, default=10, help="batches between training-status lines")
parser.add_argument("--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce")
parser.add_argument("--use-adasum", action="store_true", help="use the Adasum algorithm to do reduction")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="apply gradient predivide factor in optimizer")
parser.add_argument("--train-samples", type=int, default=6000, help="size of the synthetic training set")
parser.add_argument("--test-samples", type=int, default=1000, help="size of the synthetic test set")


class Net(nn.Module):
    """LeNet-like: two convolutions with max-pooling, dropout, two linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_mnist(samples, seed):
    """``samples`` normalized 1x28x28 images in ten classes: a random pattern per class, plus noise."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = patterns[labels] + torch.randn(samples, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset(images, labels)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def train(epoch, model, optimizer, loader, sampler, args):
    model.train()
    sampler.set_epoch(epoch)  # a new shuffle every epoch, the same partition rule on every rank
    total, start = 0.0, time.perf_counter()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(sampler)} "
                  f"({100.0 * batch_idx / len(loader):.0f}%)]\tLoss: {loss.item():.6f}", flush=True)
    rate = len(sampler) * hvd.size() / (time.perf_counter() - start)
    return metric_average(total / len(loader), "avg_train_loss"), rate


def test(model, loader, sampler):
    model.eval()
    test_loss, test_accuracy = 0.0, 0.0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            test_accuracy += output.argmax(1).eq(target).float().sum().item()
    return (metric_average(test_loss / len(sampler), "avg_loss"),
            metric_average(test_accuracy / len(sampler), "avg_accuracy"))


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # limit the CPU threads of each rank

    train_dataset = synthetic_mnist(args.train_samples, args.seed)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(),
                                                                    rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_dataset = synthetic_mnist(args.test_samples, args.seed + 1)
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(),
                                                                   rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    lr_scaler = 1 if args.use_adasum else hvd.size()  # Adasum does not need the learning rate scaled up
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    for epoch in range(1, args.epochs + 1):
        train_loss, rate = train(epoch, model, optimizer, train_loader, train_sampler, args)
        test_loss, test_accuracy = test(model, test_loader, test_sampler)
        if hvd.rank() == 0:
            print(f"epoch {epoch}/{args.epochs}  train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                  f"accuracy {100.0 * test_accuracy:.2f}%  samples/s {rate:.0f}", flush=True)


if __name__ == "__main__":
    main(parser.parse_args())
