"""Known populations for the coverage suite, and their true values, with numpy alone.

    population = POPULATIONS["over-confident"]
    split = population.draw("id", 1000, rng)      # {"logits": [k, n, C] float32, "labels": [n] or None}
    truth = true_values(population)               # {column key: the population's value}

A population is a generative model of one ensemble's predictions (k = 4 members, 10 classes):
each example has base logits b = scale·g (g standard normal), member i predicts softmax(b + spread·εᵢ),
and the label is drawn from a known distribution q(x) made from the ensemble's mean prediction p̄(x)
— q = p̄ (calibrated), a tempered p̄ (over- or under-confident), or a temperature that depends on the
confidence (mixed per bin). Because q is known, every true value is an expectation over x alone
(Rao–Blackwellised: P(correct | x) = q(argmax p̄ | x), no label noise), computed on a large draw of x
(`TRUTH_EXAMPLES`) or in closed form. Member geometry is synthetic too: Gaussian features whose
population linear CKA is a closed form, and per-example loss curves whose population barrier is the
height of their bump.

Nothing here imports ensdiag: the truths are written from the definitions in docs/conventions.md,
so a bug in ensdiag's statistic cannot hide in its own truth.
"""

import math
from dataclasses import dataclass

import numpy as np

CLASSES, MEMBERS, BINS = 10, 4, 15
TRUTH_EXAMPLES = 1_000_000  # x's drawn per split for the true values (chunks of CHUNK)
CHUNK = 100_000
VALIDATION = 1_000  # the validation split the temperature is fitted on: drawn once per population, held fixed
PATH_POINTS = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class Split:
    """One split's generative model: base logits scale·g, member noise `spread`, labels from q(p̄)."""
    scale: float
    spread: float
    calibration: tuple = ("temper", 1.0)  # ("temper", T): q ∝ p̄^(1/T); ("mixed", T_low, T_high, cut)
    labelled: bool = True


@dataclass(frozen=True)
class Population:
    name: str
    description: str
    id: Split
    ood: Split
    shift: Split | None = None  # None: no shift split (the shift columns are measured on the populations that set one)
    cka: tuple = (0.6, 0.3)  # (member-specific loading δ, feature noise σ): smaller → members more alike
    barriers: tuple = (0.15, 0.05, 0.10)  # population test-loss, error and train-loss barriers
    seed: int = 0
    everything: bool = True  # False: an OOD population, whose ID split is another's: the OOD-reading columns only

    def split(self, name: str) -> Split:
        return {"id": self.id, "val": self.id, "ood": self.ood, "shift": self.shift}[name]

    def draw(self, name: str, n: int, rng) -> dict:
        """n examples of split `name`: member logits [k, n, C] (float32) and labels (None for OOD)."""
        split = self.split(name)
        logits, p_mean = _logits(split, n, rng)
        labels = None
        if split.labelled:
            q = calibrated(p_mean, split.calibration)
            labels = (q.cumsum(1) < rng.random((n, 1))).sum(1).clip(max=CLASSES - 1)
        return {"logits": logits.astype(np.float32), "labels": labels}


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _logits(split: Split, n: int, rng):
    base = split.scale * rng.standard_normal((n, CLASSES))
    logits = base[None] + split.spread * rng.standard_normal((MEMBERS, n, CLASSES))
    return logits, _softmax(logits.astype(np.float32).astype(np.float64)).mean(0)  # p̄ of the float32 logits handed over


def calibrated(p_mean, calibration) -> np.ndarray:
    """q(x), the label distribution, from p̄(x): tempered (T > 1 softer than p̄: over-confident), or a
    temperature that depends on the confidence (`mixed`: under-confident below `cut`, over above)."""
    kind, *parameters = calibration
    log_p = np.log(np.clip(p_mean, 1e-300, None))
    if kind == "temper":
        temperature = np.full((len(p_mean), 1), parameters[0])
    else:
        low, high, cut = parameters
        temperature = np.where(p_mean.max(1, keepdims=True) < cut, low, high)
    return _softmax(log_p / temperature)


MEDIUM_OOD = Split(scale=2.0, spread=0.8, labelled=False)


def _shift(calibration) -> Split:
    """A shift split: the same classes seen less clearly (less signal, more member noise)."""
    return Split(3.25, 0.75, calibration)


POPULATIONS = {population.name: population for population in [
    Population("calibrated", "labels drawn from p̄ itself: calibrated in every sense (every calibration error is 0)",
               Split(5.0, 0.6, ("temper", 1.0)), MEDIUM_OOD, _shift(("temper", 1.0)), seed=1),
    Population("over-confident", "labels from p̄ tempered by T = 1.25: over-confident in every bin",
               Split(5.0, 0.6, ("temper", 1.25)), MEDIUM_OOD, _shift(("temper", 1.25)), seed=2),
    Population("under-confident", "labels from p̄ sharpened (T = 0.8): under-confident in every bin",
               Split(5.0, 0.6, ("temper", 0.8)), MEDIUM_OOD, seed=3),
    Population("mixed", "under-confident below confidence 0.7 (T = 0.7), over-confident above (T = 1.4): "
               "bins of both signs, and bins near 0", Split(5.0, 0.6, ("mixed", 0.7, 1.4, 0.7)), MEDIUM_OOD,
               _shift(("mixed", 0.7, 1.4, 0.7)), seed=4),
    Population("near-collapsed", "members almost identical (member noise 0.03): diversity near 0, CKA near 1, "
               "no barrier", Split(5.0, 0.03, ("temper", 1.15)), Split(2.0, 0.03, labelled=False),
               cka=(0.02, 0.02), barriers=(0.0, 0.0, 0.0), seed=5),
    Population("easy OOD", "OOD inputs with little signal (scale 0.5): AUROC near 1 (OOD-reading columns)",
               Split(5.0, 0.6, ("temper", 1.15)), Split(0.5, 0.8, labelled=False), seed=6, everything=False),
    Population("hard OOD", "OOD inputs almost as clear as ID (scale 4): AUROC near 0.6 (OOD-reading columns)",
               Split(5.0, 0.6, ("temper", 1.15)), Split(4.0, 0.8, labelled=False), seed=7, everything=False),
]}


# ------------------------------------------------------------------ member geometry

FEATURES, LATENT, LAYERS = 6, 4, 2


def _loadings(population: Population):
    """Per layer: a shared loading A [LATENT, FEATURES] and each member's own (A + δ·Bᵢ)."""
    rng = np.random.default_rng(1000 + population.seed)
    delta, _ = population.cka
    found = []
    for _ in range(LAYERS):
        shared = rng.standard_normal((LATENT, FEATURES))
        found.append([shared + delta * rng.standard_normal((LATENT, FEATURES)) for _ in range(MEMBERS)])
    return found


def features(population: Population, n: int, rng) -> dict:
    """{layer: [k arrays [n, FEATURES]]}: member i's features u·Aᵢ + σ·noise of shared latents u."""
    _, noise = population.cka
    found = {}
    for layer, loadings in enumerate(_loadings(population)):
        latent = rng.standard_normal((n, LATENT))
        found[f"layer{layer}"] = [latent @ a + noise * rng.standard_normal((n, FEATURES)) for a in loadings]
    return found


def true_cka(population: Population) -> float:
    """Population linear CKA, mean over member pairs and layers: ‖Σᵢⱼ‖²_F / (‖Σᵢᵢ‖_F‖Σⱼⱼ‖_F) with
    Σᵢⱼ = AᵢᵀAⱼ (+ σ²I on the diagonal blocks): the covariances of u·Aᵢ + σ·noise."""
    _, noise = population.cka
    values = []
    for loadings in _loadings(population):
        own = [a.T @ a + noise**2 * np.eye(FEATURES) for a in loadings]
        for i in range(MEMBERS):
            for j in range(MEMBERS):
                if i != j:
                    cross = loadings[i].T @ loadings[j]
                    values.append((cross**2).sum() / math.sqrt((own[i] ** 2).sum() * (own[j] ** 2).sum()))
    return float(np.mean(values))


def loss_curves(population: Population, n: int, rng, pairs: int = 2) -> list[dict]:
    """Per member pair, the per-example values along a path of 11 points: {"loss": [points, n],
    "accuracy": [points, n], "train_loss": [points, n]}, whose excess over the line between the ends has
    population mean height·sin(πt) (loss: a smooth bump with example-level noise; accuracy: 0/1 errors
    coupled through one uniform per example)."""
    loss_height, error_height, train_height = population.barriers
    t = np.array(PATH_POINTS)[:, None]
    found = []
    for _ in range(pairs):
        curves = {}
        for key, height in (("loss", loss_height), ("train_loss", train_height)):
            ends = rng.gamma(2.0, 0.25, (2, n))  # each example's loss at the two members
            wobble = rng.standard_normal((2, n))
            curves[key] = ((1 - t) * ends[0] + t * ends[1] + np.sin(np.pi * t) * (height + 0.4 * wobble[0])
                           + 0.3 * np.sin(2 * np.pi * t) * wobble[1])
        u = rng.random(n)
        error = 0.2 + error_height * np.sin(np.pi * t)  # P(wrong) along the path, 0.2 at both ends
        curves["accuracy"] = (u >= error).astype(np.float64)
        found.append(curves)
    return found


# ------------------------------------------------------------------ true values

def validation(population: Population) -> dict:
    """The validation split every replicate shares (the temperature is fitted on it, held as measured)."""
    return population.draw("val", VALIDATION, np.random.default_rng(2000 + population.seed))


def fitted_temperatures(population: Population) -> tuple[float, list[float]]:
    """(T of the pooled log p̄, each member's T): the minimisers of the validation NLL (scipy)."""
    from scipy.optimize import minimize_scalar
    val = validation(population)
    logits, labels = val["logits"].astype(np.float64), val["labels"]

    def fit(log_p):
        def nll(log_t):
            scaled = log_p / math.exp(log_t)
            scaled = scaled - scaled.max(1, keepdims=True)
            return float(np.mean(np.log(np.exp(scaled).sum(1)) - scaled[np.arange(len(labels)), labels]))
        return math.exp(minimize_scalar(nll, bounds=(math.log(0.02), math.log(50)), method="bounded",
                                        options={"xatol": 1e-10}).x)
    log_mean = np.log(_softmax(logits).mean(0))
    return fit(log_mean), [fit(member) for member in logits]


def _entropy(p):
    return -(p * np.log(np.clip(p, 1e-300, None))).sum(-1)


def _bin(values):
    """The ECE's equal-width bin of each value: [0, 1/15], then (lo, hi]."""
    return np.searchsorted(np.linspace(0, 1, BINS + 1)[1:-1], values, side="left")


class _Sums:
    """Running sums over chunks of x: means of per-example expectations and the ECE's per-bin sums."""

    def __init__(self):
        self.means, self.bins, self.kept = {}, {}, {}

    def mean(self, key, values):
        self.means[key] = self.means.get(key, 0.0) + float(np.sum(values))

    def binned(self, key, index, columns, bins=BINS):
        found = np.stack([np.bincount(index, weights=column, minlength=bins) for column in columns])
        self.bins[key] = self.bins.get(key, 0.0) + found

    def keep(self, key, values):
        self.kept.setdefault(key, []).append(values)


def _labelled_terms(sums: _Sums, p, p_mean, q, tag=""):
    """The expectations every labelled column reads, for one chunk (q: the label distribution)."""
    log_p, log_mean = np.log(np.clip(p, 1e-300, None)), np.log(np.clip(p_mean, 1e-300, None))
    pred = p_mean.argmax(1)
    rows = np.arange(len(pred))
    right = q[rows, pred]
    conf = p_mean.max(1)
    sums.mean("accuracy", right)
    sums.mean("nll", -(q * log_mean).sum(1))
    sums.mean("brier", (p_mean**2).sum(1) - 2 * (p_mean * q).sum(1) + 1)
    sums.binned("ece", _bin(conf), [np.ones_like(conf), conf, right])
    if tag != "id":
        return
    sums.keep("confidence", conf)
    sums.keep("right", right)
    index = np.concatenate([_bin(p_mean[:, c]) + c * BINS for c in range(CLASSES)])
    sums.binned("classwise", index, [np.ones(len(index)), p_mean.T.reshape(-1), q.T.reshape(-1)], CLASSES * BINS)
    member_pred = p.argmax(2)  # [k, m]
    member_right = q[rows[None], member_pred]  # P(member i right | x)
    nll_gibbs = -(q[None] * log_p).sum(2).mean(0)
    geometric = _softmax(log_p.mean(0))
    brier_gibbs = ((p**2).sum(2) - 2 * (p * q[None]).sum(2) + 1).mean(0)
    sums.mean("nll_gibbs", nll_gibbs)
    sums.mean("nll_geometric", -(q * np.log(np.clip(geometric, 1e-300, None))).sum(1))
    sums.mean("brier_gibbs", brier_gibbs)
    sums.mean("error_gibbs", 1 - member_right.mean(0))
    for i in range(MEMBERS):
        sums.mean(f"wrong{i}", 1 - member_right[i])
        for j in range(i + 1, MEMBERS):
            both = 1 - member_right[i] - member_right[j] + np.where(member_pred[i] == member_pred[j], member_right[i], 0)
            sums.mean(f"wrong{i}{j}", both)


def _label_free_terms(sums: _Sums, p, p_mean, tag):
    log_p = np.log(np.clip(p, 1e-300, None))
    entropy = _entropy(p_mean)
    sums.mean(f"{tag}:entropy", entropy)
    sums.mean(f"{tag}:jsd", np.clip(entropy - _entropy(p).mean(0), 0, None))
    pred = p.argmax(2)
    differ = sum((pred[i] != pred[j]).astype(float) for i in range(MEMBERS) for j in range(MEMBERS) if i != j)
    sums.mean(f"{tag}:disagreement", differ / (MEMBERS * (MEMBERS - 1)))
    sums.keep(f"{tag}:score", 1 - p_mean.max(1))
    if tag == "id":
        pairs = MEMBERS * (MEMBERS - 1)
        kl = sum((p[i] * (log_p[i] - log_p[j])).sum(1) for i in range(MEMBERS) for j in range(MEMBERS) if i != j)
        js = sum(_entropy((p[i] + p[j]) / 2) - (_entropy(p[i]) + _entropy(p[j])) / 2
                 for i in range(MEMBERS) for j in range(MEMBERS) if i != j)
        sums.mean("pair_kl", kl / pairs)
        sums.mean("pair_jsd", js / pairs)
        sums.mean("ambiguity", ((p - p_mean[None]) ** 2).sum(2).mean(0))


def _temperature_terms(sums: _Sums, logits, p_mean, q, temperatures):
    pooled, members = temperatures
    rows = np.arange(len(q))
    scaled = _softmax(np.log(np.clip(p_mean, 1e-300, None)) / pooled)
    conf, pred = scaled.max(1), scaled.argmax(1)
    sums.binned("ece_pool_then_calibrate", _bin(conf), [np.ones_like(conf), conf, q[rows, pred]])
    sums.mean("nll_pool_then_calibrate", -(q * np.log(np.clip(scaled, 1e-300, None))).sum(1))
    pooled_members = _softmax(logits / np.array(members)[:, None, None]).mean(0)
    conf, pred = pooled_members.max(1), pooled_members.argmax(1)
    sums.binned("ece_calibrate_then_pool", _bin(conf), [np.ones_like(conf), conf, q[rows, pred]])


def _ece(sums):
    """(Σ_b mass|gap|, Σ_b mass·gap, max over filled bins |gap|) of per-bin sums [mass, Σconf, Σright]."""
    mass, confidence, right = sums
    filled = mass > 0
    gap = (confidence - right)[filled] / mass[filled]
    share = mass[filled] / mass.sum()
    return float((share * np.abs(gap)).sum()), float((share * gap).sum()), float(np.abs(gap).max())


def _equal_mass(confidence, right, bins=BINS):
    """Per-bin mean gaps and masses of equal-mass bins of the confidence (the population's quantiles)."""
    order = np.argsort(confidence, kind="stable")
    groups = np.array_split(order, bins)
    return (np.array([np.mean(confidence[g] - right[g]) for g in groups]),
            np.array([len(g) for g in groups]) / len(order))


def smooth_ece(confidence, residual, kernel="reflected", cells=4_000):
    """SmoothECE of a population (Błasiok & Nakkiran 2023) from a large draw: f = confidence, residual
    = f − P(correct | x); ∫|r̂|δ̂ at the σ with smECE_σ = σ (bisection to 10⁻⁷, at least 0.001). "reflected": the Gaussian
    on [0, 1] reflected at both ends; "logit": the Gaussian of width 4σ in log-odds of f clipped to
    [0.001, 0.999], on the mesh t = j/(P − 1) (P = max(round(10/σ), 200), the ends counted twice),
    the density carried back by 1/(t(1 − t)), not reflected (torch-uncertainty's default)."""
    if kernel == "reflected":
        where = confidence
        edges = np.linspace(0, 1, cells + 1)
    else:
        clipped = np.clip(confidence, 0.001, 0.999)
        where = np.log(clipped / (1 - clipped))
        edges = np.linspace(where.min() - 1e-9, where.max() + 1e-9, cells + 1)
    mass = np.histogram(where, edges)[0] / len(where)
    pull = np.histogram(where, edges, weights=residual)[0] / len(where)
    centres = (edges[:-1] + edges[1:]) / 2

    def at(sigma):
        if kernel == "reflected":
            t = np.linspace(0, 1, 1001)
            images = [centres, -centres, 2 - centres]
            width = sigma
        else:
            points = max(round(10 / sigma), 200)
            t = np.linspace(0, 1, points)[1:-1]
            images, width = [centres], 4 * sigma
            t = np.concatenate([t[:1], t, t[-1:]])
        spot = t if kernel == "reflected" else np.log(t / (1 - t))
        kernel_sum = sum(np.exp(-((spot[:, None] - image[None]) ** 2) / (2 * width**2)) for image in images)
        density, residual_sum = kernel_sum @ mass, kernel_sum @ pull
        if kernel == "reflected":
            return float(np.abs(residual_sum).sum() / density.sum())
        weight = density / (t * (1 - t))
        ratio = np.where(density > 0, residual_sum / np.where(density > 0, density, 1), 0)
        return float((np.abs(ratio) * weight).sum() / weight.sum())

    low, high = 0.001, 1.0  # σ* below 0.001 counts as 0.001 (ensdiag's and relplot's floor)
    if at(high) > high:
        return at(high)
    if at(low) <= low:
        return at(low)
    for _ in range(23):
        middle = (low + high) / 2
        low, high = (middle, high) if at(middle) > middle else (low, middle)
    return at(high)


def _scores_metrics(id_score, ood_score) -> dict:
    """AUROC, AUPR-Out and FPR95 (both directions) of a population: scikit-learn on the large draw (as
    many OOD as ID examples, as in every replicate), the FPR95s from the two score distributions."""
    from sklearn.metrics import average_precision_score, roc_auc_score
    truth = np.concatenate([np.zeros(len(id_score)), np.ones(len(ood_score))])
    scores = np.concatenate([id_score, ood_score])
    accept = np.quantile(id_score, 0.95, method="inverted_cdf")  # the smallest τ accepting ≥ 95 % of ID
    flag = np.quantile(ood_score, 0.05, method="inverted_cdf")  # the largest τ flagging ≥ 95 % of OOD (continuous)
    return {"auroc": roc_auc_score(truth, scores), "aupr_out": average_precision_score(truth, scores),
            "fpr95_ood_as_id": float(np.mean(ood_score <= accept)), "fpr95_id_as_ood": float(np.mean(id_score >= flag))}


def true_values(population: Population, examples: int = TRUTH_EXAMPLES) -> dict:
    """{column key "analyzer/path": the population's value} for every column the suite knows; keys are
    ensdiag's metric paths (the interval pass's), so a column ensdiag adds has no truth until one is
    written here."""
    rng = np.random.default_rng(3000 + population.seed)
    temperatures = fitted_temperatures(population)
    found = {}
    for tag in ("id", "shift", "ood"):
        split, sums = population.split(tag), _Sums()
        if split is None:
            continue
        for start in range(0, examples, CHUNK):
            logits, p_mean = _logits(split, min(CHUNK, examples - start), rng)
            logits = logits.astype(np.float32).astype(np.float64)
            p = _softmax(logits)
            _label_free_terms(sums, p, p_mean, tag)
            if split.labelled:
                q = calibrated(p_mean, split.calibration)
                _labelled_terms(sums, p, p_mean, q, tag)
                if tag == "id":
                    _temperature_terms(sums, logits, p_mean, q, temperatures)
        mean = {key: value / examples for key, value in sums.means.items()}
        kept = {key: np.concatenate(parts) for key, parts in sums.kept.items()}
        found[f"uncertainty/splits/{tag}/entropy/value"] = mean[f"{tag}:entropy"]
        found[f"uncertainty/splits/{tag}/jsd/value"] = mean[f"{tag}:jsd"]
        found[f"disagreement/splits/{tag}/mean/value"] = mean[f"{tag}:disagreement"]
        found[f"{tag}:score"] = kept[f"{tag}:score"]
        if split.labelled:
            ece, signed, mce = _ece(sums.bins["ece"])
            for key in ("accuracy", "nll", "brier"):
                found[f"calibration/splits/{tag}/{key}/value"] = mean[key]
            found[f"calibration/splits/{tag}/ece/value"] = ece
            ece = 0.0 if ece < 1e-12 else ece  # calibrated: 0 up to rounding (no direction to speak of)
        if tag == "id":
            found.update(_id_truths(mean, sums, kept, ece, signed, mce))
    found.update({f"ood/scores/msp/{key}/value": value
                  for key, value in _scores_metrics(found.pop("id:score"), found.pop("ood:score")).items()})
    found.pop("shift:score", None)
    found["cka/splits/id/mean/value"] = found["cka/splits/ood/mean/value"] = true_cka(population)
    loss, error, train = population.barriers
    found.update({"paths/loss_barrier/value": loss, "paths/accuracy_barrier/value": error,
                  "paths/train_loss_barrier/value": train})
    return found


def _id_truths(mean, sums, kept, ece, signed, mce) -> dict:
    confidence, right = kept["confidence"], kept["right"]
    gaps, masses = _equal_mass(confidence, right)
    classwise = sums.bins["classwise"].reshape(3, CLASSES, BINS)
    classwise_ece = float(np.mean([_ece(classwise[:, c])[0] for c in range(CLASSES)]))
    order = np.argsort(-confidence, kind="stable")
    errors = np.cumsum(1 - right[order])
    positions = np.arange(1, len(order) + 1)
    pairs = [(i, j) for i in range(MEMBERS) for j in range(i + 1, MEMBERS)]
    wrong = {i: mean[f"wrong{i}"] for i in range(MEMBERS)}
    both = {(i, j): mean[f"wrong{i}{j}"] for i, j in pairs}
    correlation = [(both[i, j] - wrong[i] * wrong[j]) / math.sqrt(wrong[i] * (1 - wrong[i]) * wrong[j] * (1 - wrong[j]))
                   for i, j in pairs]
    yule = []
    for i, j in pairs:
        n11, n10, n01 = both[i, j], wrong[i] - both[i, j], wrong[j] - both[i, j]
        n00 = 1 - n11 - n10 - n01
        yule.append((n11 * n00 - n10 * n01) / (n11 * n00 + n10 * n01))
    residual = confidence - right
    calibration = "calibration/splits/id"
    found = {
        f"{calibration}/ece_adaptive/value": float((masses * np.abs(gaps)).sum()),
        f"{calibration}/ece_adaptive_tu/value": float((masses * np.abs(gaps)).sum()),
        f"{calibration}/ece_classwise/value": classwise_ece,
        f"{calibration}/overconfidence/value": signed,
        f"{calibration}/ece_direction/value": signed / ece if ece > 0 else None,
        f"{calibration}/mce/value": mce,
        f"{calibration}/smooth_ece/value": smooth_ece(confidence, residual),
        f"{calibration}/smooth_ece_tu/value": smooth_ece(confidence, residual, "logit"),
        "debiased-ece/splits/id/debiased_l2/value": float(np.sqrt((masses * gaps**2).sum())),
        "member-pairs/splits/id/kl/mean/value": mean["pair_kl"],
        "member-pairs/splits/id/jsd/mean/value": mean["pair_jsd"],
        "member-pairs/splits/id/ambiguity/value": mean["ambiguity"],
        "member-pairs/splits/id/double_fault/mean/value": float(np.mean([both[pair] for pair in pairs])),
        "member-pairs/splits/id/error_correlation/mean/value": float(np.mean(correlation)),
        "member-pairs/splits/id/yule_q/mean/value": float(np.mean(yule)),
        "ensemble-gain/splits/id/nll_gap/value": mean["nll_gibbs"] - mean["nll"],
        "ensemble-gain/splits/id/kl_diversity/value": mean["nll_gibbs"] - mean["nll_geometric"],
        "ensemble-gain/splits/id/brier_spread/value": mean["brier_gibbs"] - mean["brier"],
        "ensemble-gain/splits/id/error_gibbs/value": mean["error_gibbs"],
        "ensemble-gain/splits/id/error_ensemble/value": 1 - mean["accuracy"],
        "selective/splits/id/aurc/value": float(np.mean(errors / positions)),
        "selective/splits/id/aurc_trapezoid/value": float(np.mean(errors / positions)),
        "selective/splits/id/augrc/value": float(np.mean(errors) / len(order)),
        "selective/splits/id/augrc_trapezoid/value": float(np.mean(errors) / len(order)),
        "temperature/splits/id/before/ece/value": ece,
        "temperature/splits/id/pool_then_calibrate/ece/value": _ece(sums.bins["ece_pool_then_calibrate"])[0],
        "temperature/splits/id/calibrate_then_pool/ece/value": _ece(sums.bins["ece_calibrate_then_pool"])[0],
        "temperature/splits/id/pool_then_calibrate/nll/value": mean["nll_pool_then_calibrate"],
    }
    return found
