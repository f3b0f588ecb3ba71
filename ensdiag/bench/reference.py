"""The reference pipeline: how the reference paper's stack trains, timed beside the fast path.

- a `DataLoader` over CPU tensors, shuffled by its sampler, each batch moved to the device;
- per-sample torchvision transforms on the CPU as the batch is assembled (uint8 crop and
  flip for CIFAR, then scale to [0, 1] and normalise);
- fp16 autocast with a `GradScaler` on CUDA, fp32 on CPU; the optimiser's default
  (unfused) update;
- Deep Ensembles as a Python loop over k separate `single` networks, one optimiser over all
  of them; every other method is the same model the fast path trains.

It is a real trainer (`train_epoch` returns loss and accuracy), so tests can check that the
fast path learns what it learns.
"""

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from ..nn import METHODS, build_model
from ..nn.methods import members_for
from ..train import make_optimizer, member_loss


class TransformedImages(Dataset):
    """uint8 images [N, C, H, W] and labels, transformed one sample at a time."""

    def __init__(self, images, labels, mean, std, augment=False):
        crop = [v2.RandomCrop(images.shape[-1], padding=4), v2.RandomHorizontalFlip()] if augment else []
        self.transform = v2.Compose([*crop, v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), self.labels[i]


def make_loader(images, labels, config, batch_size, shuffle, workers, device, seed=0, augment=False):
    dataset = TransformedImages(images, labels, config.mean, config.std, augment)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers,
                      pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                      generator=torch.Generator().manual_seed(seed))


class ReferenceModel:
    """One model, or k separate `single` networks for a Deep Ensemble, with its optimiser and schedule."""

    def __init__(self, config, run, device, seed=0, amp=None):
        """`amp`: fp16 autocast with a GradScaler (default: on CUDA only; tests turn it on on the CPU)."""
        method, options = config.model_options(run)
        torch.manual_seed(seed)
        k = config.members
        self.separate = METHODS[method].reference_separate_members
        if self.separate:  # the textbook way: k separate `single` networks, one after another
            self.networks = [build_model(config.arch, "single", 1, config.num_classes, config.input_shape).to(device)
                             for _ in range(k)]
        else:
            self.networks = [build_model(config.arch, method, members_for(method, k),
                                         config.num_classes, config.input_shape, **options).to(device)]
        self.method, self.num_members, self.device = method, k, device
        self.split_batch = config.be_split_batch
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.optimizer, self.scheduler = make_optimizer(torch.nn.ModuleList(self.networks), config, fused=False)
        self.amp = device.type == "cuda" if amp is None else amp
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp)

    def member_logits(self, x, train: bool):
        """[m, B, C]: each network's logits (m = k for Deep Ensembles and BatchEnsemble)."""
        for network in self.networks:
            network.train(train)
        if self.separate:
            return torch.stack([network.forward_members(x[None])[0] for network in self.networks])
        return self.networks[0](x)

    def train_epoch(self, loader, max_batches=None):
        """One pass (or `max_batches` batches) of the loader; (mean member loss, accuracy)."""
        total_loss = total_correct = seen = 0.0
        for step, (x, y) in enumerate(loader):
            if max_batches is not None and step >= max_batches:
                break
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp):
                if self.separate:  # logits [m, b, C], labels [m, b]: the batch as the method's kit hands it over
                    logits = self.member_logits(x, train=True)
                    labels = y.expand(len(logits), -1)
                else:
                    network = self.networks[0].train()
                    xs, labels = network.kit.member_batch(x[None], y[None], split_batch=self.split_batch,
                                                          generator=self.generator)
                    logits = network.forward_members(xs)
            members = logits.shape[0]
            over_members = self.networks[0].kit.loss_over_members
            loss = member_loss(logits.float(), labels, over_members)
            self.optimizer.zero_grad()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            total_loss += loss.item() / (members if over_members == "sum" else 1) * labels.shape[1]
            total_correct += (logits.argmax(-1) == labels).float().sum().item() / members
            seen += labels.shape[1]
        return total_loss / max(seen, 1), total_correct / max(seen, 1)

    @torch.no_grad()
    def predict(self, loader, max_batches=None):
        """Member logits [k, N, C] over the loader (MC Dropout: k passes, masks on)."""
        chunks = []
        for step, (x, _) in enumerate(loader):
            if max_batches is not None and step >= max_batches:
                break
            with torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp):
                chunks.append(self.member_logits(x.to(self.device, non_blocking=True), train=False).float())
        return torch.cat(chunks, dim=1)
