"""The forms an agent commonly writes each practice in, one positive and one negative case each: a detector must see
the practice however it is spelled, and must not see it in the look-alike that is not it."""

from __future__ import annotations

import pytest

from rexmle_agents.analysis.detectors import detect
from rexmle_agents.analysis.factors import load_rubrics

RUBRIC = load_rubrics().label
CT = "low-dose abdominal CT (single slices)"
MR = "MRI (DWI b=1000, ADC, FLAIR)"

# (form, code, factor, expected, modality)
CASES = [
    # ---- hyper-parameter search
    ("grid as a comprehension with argmax",
     "scores = [cv_score(Ridge(alpha=a)) for a in [0.01, 0.1, 1.0, 10.0]]\nbest = alphas[int(np.argmax(scores))]\n",
     "hyperparameter_search", True, CT),
    ("comprehension over batches with a class argmax",
     "probs = [model(x) for x in loader]\nlabels = np.argmax(np.concatenate(probs), axis=1)\n",
     "hyperparameter_search", False, CT),
    ("dict comprehension over a named grid, max by key",
     "results = {lr: validate(train(lr)) for lr in learning_rates}\nchosen = max(results, key=results.get)\n",
     "hyperparameter_search", True, CT),
    ("a comprehension over a grid with nothing kept",
     "models = [train(lr) for lr in learning_rates]\nsave(models)\n", "hyperparameter_search", False, CT),
    ("itertools.product loop with a best tracker",
     "for lr, wd in itertools.product([1e-3, 1e-4], [0.0, 1e-2]):\n    s = run(lr, wd)\n    if s > best_score:\n"
     "        best_score, best_cfg = s, (lr, wd)\n", "hyperparameter_search", True, CT),
    ("product used to build a patch grid, no search",
     "for i, j in itertools.product(range(ny), range(nx)):\n    tiles.append(img[i:i + 64, j:j + 64])\n",
     "hyperparameter_search", False, CT),
    ("learning rates in a loop with the best kept",
     "for lr in LEARNING_RATES:\n    val = fit(lr)\n    best_lr = lr if val > best_val else best_lr\n",
     "hyperparameter_search", True, CT),
    ("an epoch loop keeping the best checkpoint",
     "for epoch in range(EPOCHS):\n    val = evaluate()\n    if val > best_val:\n        best_val = val\n",
     "hyperparameter_search", False, CT),
    ("a random search over trials",
     "for trial in range(N_TRIALS):\n    lr = 10 ** rng.uniform(-5, -2)\n    best = max(best, score(lr))\n",
     "hyperparameter_search", True, CT),
    ("sklearn GridSearchCV", "search = GridSearchCV(Ridge(), {'alpha': [0.1, 1, 10]}, cv=5)\n",
     "hyperparameter_search", True, CT),
    ("sklearn RandomizedSearchCV", "search = RandomizedSearchCV(model, space, n_iter=20)\n",
     "hyperparameter_search", True, CT),
    ("cross_val_score once, no search", "print(cross_val_score(Ridge(alpha=1.0), x, y, cv=5).mean())\n",
     "hyperparameter_search", False, CT),
    ("optuna study.optimize", "study.optimize(objective, n_trials=30)\n", "hyperparameter_search", True, CT),
    ("optuna imported, never used", "import optuna\nprint('optuna available')\n", "hyperparameter_search", False,
     CT),
    ("scikit-optimize BayesSearchCV", "opt = BayesSearchCV(SVR(), {'C': (1e-3, 1e3, 'log-uniform')})\n",
     "hyperparameter_search", True, CT),
    ("keras-tuner", "tuner = kt.Hyperband(build_model, objective='val_loss', max_epochs=10)\n",
     "hyperparameter_search", True, CT),
    # ---- data augmentation
    ("torchio random transforms", "aug = tio.Compose([tio.RandomElasticDeformation(), tio.RandomBiasField()])\n",
     "data_augmentation", True, CT),
    ("a random forest is not an augmentation", "model = RandomForestRegressor(n_estimators=200)\n",
     "data_augmentation", False, CT),
    ("albumentations without a Random prefix", "train_tf = A.Compose([A.Rotate(limit=15), A.Transpose()])\n",
     "data_augmentation", True, CT),
    ("albumentations normalisation only", "val_tf = A.Compose([A.Normalize(), A.Resize(256, 256)])\n",
     "data_augmentation", False, CT),
    ("Keras ImageDataGenerator with ranges", "gen = ImageDataGenerator(rotation_range=15, horizontal_flip=True)\n",
     "data_augmentation", True, CT),
    ("Keras ImageDataGenerator rescaling only", "gen = ImageDataGenerator(rescale=1 / 255, rotation_range=0)\n",
     "data_augmentation", False, CT),
    ("a hand-written mixup", "lam = np.random.beta(0.4, 0.4)\nx = lam * x + (1 - lam) * x[perm]\n",
     "data_augmentation", True, CT),
    ("a beta-distributed prior that is no mixup", "prior = stats.beta(2, 5)\nw = prior.pdf(grid)\n",
     "data_augmentation", False, CT),
    ("a random rotation with scipy", "angle = rng.uniform(-15, 15)\nimage = ndimage.rotate(image, angle, "
                                     "reshape=False)\n", "data_augmentation", True, CT),
    ("a fixed resize with scipy zoom", "image = ndimage.zoom(image, 0.5)\n", "data_augmentation", False, CT),
    ("a random horizontal flip with cv2", "if random.random() < 0.5:\n    image = cv2.flip(image, 1)\n",
     "data_augmentation", True, CT),
    ("test-time flip with cv2, no random draw", "tta = model(cv2.flip(image, 1))\n", "data_augmentation", False, CT),
    # ---- seed / fold ensembles
    ("fold models averaged in a comprehension",
     "fold_models = [train(f) for f in range(N_FOLDS)]\ntest = np.mean([m.predict(x_test) for m in fold_models], "
     "axis=0)\n", "seed_fold_ensembles", True, CT),
    ("fold scores averaged, not predictions",
     "scores = [train_fold(f) for f in range(N_FOLDS)]\nprint(np.mean([dice(p, t) for p, t in pairs]))\n",
     "seed_fold_ensembles", False, CT),
    ("seeds in a comprehension, summed over their count",
     "preds = [fit(seed=s).predict(x) for s in SEEDS]\nfinal = sum(preds) / len(preds)\n",
     "seed_fold_ensembles", True, CT),
    ("several seeds, only the last model kept",
     "for seed in SEEDS:\n    model = fit(seed)\nfinal = model.predict(x)\n", "seed_fold_ensembles", False, CT),
    ("a loop over fold models with a torch mean",
     "for model in fold_models:\n    outs.append(model(x))\navg = torch.mean(torch.stack(outs), 0)\n",
     "seed_fold_ensembles", True, CT),
    # ---- post-processing
    ("label imported by name from scipy",
     "from scipy.ndimage import label, binary_fill_holes\nlabels, n = label(mask)\n", "post_processing", True, CT),
    ("a parenthesised import over several lines",
     "from scipy.ndimage import (\n    binary_fill_holes as fill,\n    label,\n)\nmask = fill(mask)\n",
     "post_processing", True, CT),
    ("a label function of the agent's own", "def label(row):\n    return row['y']\ny = label(rows[0])\n",
     "post_processing", False, CT),
    ("an aliased skimage import",
     "from skimage.morphology import remove_small_objects as drop_specks\nmask = drop_specks(mask, 64)\n",
     "post_processing", True, CT),
    ("sklearn's label_binarize is not a component",
     "from sklearn.preprocessing import label_binarize\ny = label_binarize(y, classes=[0, 1, 2])\n",
     "post_processing", False, CT),
    ("regionprops to filter components", "for region in measure.regionprops(labels):\n    keep(region)\n",
     "post_processing", True, CT),
    ("watershed to split touching cells", "cells = watershed(-distance, markers, mask=mask)\n", "post_processing",
     True, CT),
    ("a threshold alone is left to the judge", "mask = (prob > 0.5).astype(np.uint8)\n", "post_processing", False,
     CT),
    # ---- external data and pretrained weights
    ("segmentation_models_pytorch encoder weights",
     "net = smp.Unet('resnet34', encoder_weights='imagenet', classes=2)\n", "external_data", True, CT),
    ("no encoder weights", "net = smp.Unet('resnet34', encoder_weights=None, classes=2)\n", "external_data", False,
     CT),
    ("Keras ImageNet weights", "base = tf.keras.applications.ResNet50(weights='imagenet', include_top=False)\n",
     "external_data", True, CT),
    ("Keras without weights", "base = tf.keras.applications.ResNet50(weights=None, include_top=False)\n",
     "external_data", False, CT),
    ("open_clip pretrained tag", "model, _, pre = open_clip.create_model_and_transforms('ViT-B-32', "
                                 "pretrained='laion2b_s34b_b79k')\n", "external_data", True, CT),
    ("timm without pretraining", "model = timm.create_model('resnet18', pretrained=False)\n", "external_data", False,
     CT),
    ("gdown", "gdown.download(url, 'weights.pth', quiet=False)\n", "external_data", True, CT),
    # ---- CT / MR pre-processing
    ("a CT window as WL/WW", "WL, WW = 40, 400\nimg = np.clip(img, WL - WW / 2, WL + WW / 2)\n", "domain_knowledge",
     True, CT),
    ("DICOM slope and intercept", "hu = pixels * ds.RescaleSlope + ds.RescaleIntercept\n", "domain_knowledge", True,
     CT),
    ("air set by a mask", "img[img < -1000] = -1000\n", "domain_knowledge", True, CT),
    ("a generic min-max scaling is no CT window", "img = (img - img.min()) / (img.max() - img.min())\n",
     "domain_knowledge", False, CT),
    ("torchio clamp", "clamp = tio.Clamp(out_min=-1000, out_max=1000)\n", "domain_knowledge", True, CT),
    ("MR z-score written with np.mean/np.std", "vol = (vol - np.mean(vol)) / np.std(vol)\n", "domain_knowledge",
     True, MR),
    ("ImageNet normalisation is no per-volume z-score",
     "x = (x - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)\n", "domain_knowledge", False, MR),
    ("MR percentile clipping per volume", "vol = np.clip(vol, np.percentile(vol, 0.5), np.percentile(vol, 99.5))\n",
     "domain_knowledge", True, MR),
    ("ANTs N4", "img = ants.n4_bias_field_correction(img)\n", "domain_knowledge", True, MR),
    ("torchio resampling", "resample = tio.Resample((1.0, 1.0, 1.0))\n", "domain_knowledge", True, MR),
]


@pytest.mark.parametrize(("form", "code", "factor", "expected", "modality"), CASES, ids=[c[0] for c in CASES])
def test_the_common_forms_of_each_practice(code_run, form, code, factor, expected, modality) -> None:
    verdict = {v.factor: v for v in detect(code_run({"code": code}), modality, RUBRIC)}[factor]
    assert verdict.demonstrated is expected, (form, verdict.reason, [q.quote for q in verdict.evidence])


def test_every_detected_factor_has_a_positive_and_a_negative_form() -> None:
    for factor in {c[2] for c in CASES}:
        assert {c[3] for c in CASES if c[2] == factor} == {True, False}, factor
