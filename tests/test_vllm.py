"""natbias.vllm with real vLLM (its CPU build, in .venv-vllm: `make vllm-env`):
each family that vLLM has a class of its own for, tiny and built in code, saved
by natbias.hf, is served with transformers' greedy tokens (20 prompts x 20
tokens) and log-probabilities (within float32's rounding, derived; bfloat16
to its rounding); the per-request lambda * b equals transformers'
BiasScaleLogitsProcessor; a LoRA adapter equals transformers with it merged;
tensor parallelism 2 equals 1; with b zeroed transformers gives other tokens
(the control: these comparisons can fail). The families vLLM cannot serve are
refused, saying why. vLLM's OpenAI-compatible server answers 64 concurrent
requests with the offline tokens, and bad requests with its errors.

vLLM runs in one subprocess (tests/vllm_worker.py) for all the families, the
engine in that process, so each model costs seconds, not an engine's start;
the server is one more process."""

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from hf_tiny import V, zipf_targets  # noqa: E402
from vllm_worker import KV_CACHE  # noqa: E402  (what each engine of the worker takes)

from natbias.hf import BiasScaleLogitsProcessor, add_natural_bias  # noqa: E402

pytestmark = pytest.mark.engine  # make test-fast leaves vLLM out

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("NATBIAS_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
if os.environ.get("NATBIAS_VLLM_PYTHON") == "":
    pytest.skip(
        "the vLLM tests are turned off (NATBIAS_VLLM_PYTHON is empty)", allow_module_level=True
    )
if not VLLM_PYTHON.exists():
    pytest.skip(
        f"vLLM's environment is absent ({VLLM_PYTHON}): `make vllm-env` builds it",
        allow_module_level=True,
    )

# vLLM's CPU attention takes a head size of 64 or more: 2 heads of 64.
DECODER = dict(
    vocab_size=V,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=128,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)
GPT = dict(
    vocab_size=V, n_embd=128, n_layer=1, n_head=2, n_positions=128, bos_token_id=2, eos_token_id=1
)
# family -> (configuration class, model class, settings): those vLLM serves,
# with a class of its own or (phi, olmo2: what natbias.olmo_core's to_hf
# writes) through its Transformers backend
SERVED = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", DECODER),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(DECODER, head_dim=64)),
    "mistral": ("MistralConfig", "MistralForCausalLM", DECODER),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(DECODER, head_dim=64)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(DECODER, head_dim=64)),  # soft cap
    "cohere": ("CohereConfig", "CohereForCausalLM", DECODER),  # logit scale, tied head
    "opt": ("OPTConfig", "OPTForCausalLM", dict(DECODER, ffn_dim=256, word_embed_proj_dim=128)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", GPT),  # tied head
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(GPT, rotary_dim=16)),  # b is the head's bias
    "phi": ("PhiConfig", "PhiForCausalLM", DECODER),  # the stock head has a bias
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", DECODER),
}
# Generators natbias.hf takes that vLLM 0.32 has no class for, or (GPT-NeoX)
# only its Transformers backend, which builds it otherwise than transformers.
REFUSED = {
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", DECODER),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", dict(GPT, rotary_dim=16)),
    "bart": (
        "BartConfig",
        "BartForConditionalGeneration",
        dict(
            vocab_size=V,
            d_model=128,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_layers=1,
            decoder_layers=1,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
        ),
    ),
}
PROMPTS = torch.randint(3, V, (20, 6), generator=torch.Generator().manual_seed(3)).tolist()
STEPS = 20
SCALES = (1.0, 0.5, 0.0)
# float32 (both engines): a sum of n terms rounded in any order is off by at
# most n u sum|terms| (Higham's gamma_n, u = 2^-24). Taking sum|terms| as the
# result's size (no cancellation) and the relative errors of chained sums as
# adding (first order), each sum a logit passes through adds n u of the
# logit's size (the measured gaps are about 1e-3 of this bound). A token of these
# one-layer models passes through three norms, q, k, v and the attention's
# output (over the hidden size, 128), q . k (a head, 64), the attention's
# softmax and weighted sum (over the 26 positions), the feed-forward's two
# (128, then at most 4 x 128: GPT-2's and GPT-J's), the head's W phi (128)
# and three residual additions: SUMMED terms, times the size of g W phi as
# the logit sees it (f: the family's logit scale; a soft cap's slope is <= 1).
# b is the same float32 in both engines; adding it rounds once (u |logit|).
# log p_y = z_y - logsumexp(z) moves by twice a logit's error, plus the
# logsumexp's own rounding ((V + 1) u: V exponentials summed, then the log).
# Two engines, each off by that: float32_margin.
SUMMED = 3 * 128 + 4 * 128 + 64 + 2 * (len(PROMPTS[0]) + STEPS) + 128 + 4 * 128 + 128 + 3
FLOAT32_UNIT = 2.0**-24
# bfloat16 (vLLM's CPU build runs it with its own kernels): 8 significant bits,
# so each engine rounds a logit x by up to 2^-8 |x|; a greedy step whose top-2
# gap is within 4 such units (two logits, each rounded by each engine) may go
# either way, and a row may differ from there on. Before it, the
# log-probabilities agree within 0.1 (logits of about 10, rounded by 0.04).
BFLOAT16 = ("llama", "qwen2", "gemma2", "gpt2")
BFLOAT16_UNIT, BFLOAT16_TIE, BFLOAT16_TOLERANCE = 2.0**-8, 4.0, 0.1


def build(family, table=SERVED):
    config_class, model_class, settings = table[family]
    config = getattr(transformers, config_class)(**settings)
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).eval()


def natural_bias_model(family):
    """A natural-bias model whose greedy output depends on all of W phi, g
    and b: W scaled so that g W phi spreads the logits by about 2, g = 0.4,
    b moved off the prior as training moves it, by N(0, s^2) as the logits
    see it, s half g W phi's typical lead of its first token over its
    second (at least 2): a tied head's lead on the input token is large, and
    b must overturn some to be seen (the control)."""
    model = add_natural_bias(build(family), zipf_targets()).eval()
    head = model.get_output_embeddings()
    scale = (model.natbias_logit_map or {}).get("scale", 1.0)
    with torch.no_grad():
        head.gain_param.fill_(GAIN / head.gain_speed)
        bias = model.output_bias()
        bias.zero_()
        head.weight.mul_(2.0 / model(input_ids=torch.tensor(PROMPTS)).logits.std())
        top = model(input_ids=torch.tensor(PROMPTS)).logits.topk(2, -1).values
        spread = max(2.0, (top[..., 0] - top[..., 1]).median().item() / 2)
        bias.copy_(spread * torch.randn(V, generator=torch.Generator().manual_seed(1)) / scale)
    return model


GAIN = 0.4  # g of natural_bias_model


def head_parts(model, ids):
    """(f(g W phi + b) as a function of lambda, |f'| * |g W phi|'s largest
    entry): from the head's input phi, its W and b and g = GAIN in float64,
    not through natbias's head or processor (f, the family's logit scale or
    soft cap, applied here by hand)."""
    head = model.get_output_embeddings()
    captured = {}
    hook = head.register_forward_pre_hook(lambda module, args: captured.update(phi=args[0]))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        hook.remove()
    logit_map = model.natbias_logit_map or {}

    def f(x):
        x = x * logit_map.get("scale", 1.0)
        cap = logit_map.get("softcap")
        return x if cap is None else cap * torch.tanh(x / cap)

    b = model.output_bias().detach().double()
    g_w_phi = GAIN * captured["phi"].double() @ head.weight.detach().double().T
    size = abs(logit_map.get("scale", 1.0)) * g_w_phi.abs().max().item()
    return (lambda scale: f(g_w_phi + b) + (scale - 1.0) * f(b)), size


def logits_by_hand(model, ids, scale):
    """f(g W phi + b) + (lambda - 1) f(b) (head_parts): g W phi + lambda b
    where the family maps nothing."""
    return head_parts(model, ids)[0](scale)


def float32_margin(model, ids, scale=1.0):
    """How far two float32 engines' log p of ``model`` over ``ids`` may part
    (SUMMED's derivation): 2 x (2 x (SUMMED u |f(g W phi)| + u |logit|) + (V + 1) u)."""
    logits, size = head_parts(model, ids)
    largest = logits(scale).abs().max().item()
    one_engine = 2 * (SUMMED * size + largest) + (V + 1)
    return 2 * one_engine * FLOAT32_UNIT


def greedy(model, processor=None, gaps=None):
    """Greedy tokens and their log-probabilities (float32), step by step
    over the whole sequence: transformers' forward, nothing cached. ``gaps``,
    a list, gets each step's top-2 gap in units of 2^-8 of the top logit."""
    ids = torch.tensor(PROMPTS)
    logprobs = []
    with torch.no_grad():
        for _ in range(STEPS):
            scores = model(input_ids=ids).logits[:, -1].float()
            if processor is not None:
                scores = processor(ids, scores)
            if gaps is not None:
                top = scores.topk(2, -1).values
                gaps.append((top[:, 0] - top[:, 1]) / (BFLOAT16_UNIT * top[:, 0].abs()))
            log_p = torch.log_softmax(scores, -1)
            token = log_p.argmax(-1)
            logprobs.append(log_p.gather(-1, token[:, None]))
            ids = torch.cat([ids, token[:, None]], 1)
    return ids[:, len(PROMPTS[0]) :].tolist(), torch.cat(logprobs, 1)


def bfloat16_greedy(model):
    """transformers' greedy run of ``model`` in bfloat16: tokens,
    log-probabilities and each step's top-2 gap (units of 2^-8 of the logit)."""
    gaps = []
    tokens, logprobs = greedy(copy.deepcopy(model).to(torch.bfloat16), gaps=gaps)
    return tokens, logprobs, torch.stack(gaps, 1)


def lora_adapter(path, directory):
    """A PEFT LoRA adapter (rank 8 on the attention's queries and values,
    random, written as PEFT saves one) for the saved model at ``path``, and
    transformers' greedy tokens with it merged by hand: W + (alpha / r) B A."""
    from safetensors.torch import save_file

    from natbias.hf import from_pretrained

    model = from_pretrained(path).eval()
    generator = torch.Generator().manual_seed(5)
    tensors = {}
    for name in ("q_proj", "v_proj"):
        linear = getattr(model.model.layers[0].self_attn, name)
        key = f"base_model.model.model.layers.0.self_attn.{name}"
        a = tensors[f"{key}.lora_A.weight"] = 0.3 * torch.randn(
            8, linear.in_features, generator=generator
        )
        b = tensors[f"{key}.lora_B.weight"] = 0.3 * torch.randn(
            linear.out_features, 8, generator=generator
        )
        with torch.no_grad():
            linear.weight += (16 / 8) * b @ a
    directory.mkdir()
    save_file(tensors, directory / "adapter_model.safetensors")
    config = dict(peft_type="LORA", task_type="CAUSAL_LM", r=8, lora_alpha=16, bias="none")
    config.update(target_modules=["q_proj", "v_proj"], base_model_name_or_path=str(path))
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return dict(lora_path=directory, lora=greedy(model)[0])


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """family -> (saved directory, transformers' results)."""
    root = tmp_path_factory.mktemp("vllm_models")
    made = {}
    for family in SERVED:
        model = natural_bias_model(family)
        model.save_pretrained(root / family)
        tokens, logprobs = greedy(model)
        scaled = {s: greedy(model, BiasScaleLogitsProcessor(model, s))[0] for s in SCALES}
        bfloat16 = bfloat16_greedy(model) if family in BFLOAT16 else None
        trained = copy.deepcopy(model)
        with torch.no_grad():
            model.output_bias().zero_()
        made[family] = dict(
            model=trained,
            path=root / family,
            tokens=tokens,
            logprobs=logprobs,
            scaled=scaled,
            zeroed=greedy(model)[0],
            bfloat16=bfloat16,
        )
    made["llama"].update(lora_adapter(made["llama"]["path"], root / "llama_lora"))
    return made


def vllm_environment(tmp_path):
    """vLLM's caches under the test's directory, its engine in the process;
    the KV cache is sized by each engine's kv_cache_memory_bytes (the
    environment's VLLM_CPU_KVCACHE_SPACE would override it)."""
    environment = dict(
        os.environ,
        VLLM_CACHE_ROOT=str(tmp_path / "vllm_cache"),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    environment.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return environment


@pytest.fixture(scope="module")
def served(references, tmp_path_factory):
    """What vLLM generated for each family, and what it raised for each family
    it cannot serve (one subprocess for all: a second would add vLLM's start-up)."""
    work = tmp_path_factory.mktemp("vllm_worker")
    for family in REFUSED:
        add_natural_bias(build(family, REFUSED), zipf_targets()).save_pretrained(work / family)
    spec = dict(
        prompts=PROMPTS,
        steps=STEPS,
        scales=list(SCALES),
        models=[
            dict(name=f, path=str(r["path"]), dtype="float32", lora=str(r.get("lora_path", "")))
            for f, r in references.items()
        ]
        + [
            dict(name=f"{f}-bfloat16", path=str(references[f]["path"]), dtype="bfloat16")
            for f in BFLOAT16
        ]
        + [
            dict(
                name="llama-tp2",
                path=str(references["llama"]["path"]),
                dtype="float32",
                tensor_parallel_size=2,
            )
        ],
        refused=[dict(name=f, path=str(work / f)) for f in REFUSED],
    )
    return run_worker(work, spec)


def run_worker(work, spec):
    """vllm_worker.py's results for ``spec``, and vLLM's log."""
    (work / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run(
        [
            str(VLLM_PYTHON),
            str(Path(__file__).with_name("vllm_worker.py")),
            "spec.json",
            "out.json",
        ],
        cwd=work,
        env=vllm_environment(work),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(
        (work / "out.json").read_text()
    ), run.stdout + run.stderr  # vLLM logs to stdout


@pytest.mark.parametrize("family", SERVED)
def test_vllm_serves_the_greedy_tokens_and_log_probabilities_of_transformers(
    family, references, served
):
    results, _ = served
    result, reference = results[family], references[family]
    assert "error" not in result, result.get("error")
    assert result["tokens"] == reference["tokens"]
    gap = (torch.tensor(result["logprobs"]) - reference["logprobs"]).abs().max().item()
    margin = float32_margin(reference["model"], with_tokens(reference["tokens"]))
    assert gap < margin, f"{family}: log-probabilities {gap:.2e} apart (margin {margin:.2e})"


def with_tokens(tokens):
    """The prompts followed by the generated ``tokens``: every position a log p was read at."""
    return torch.cat([torch.tensor(PROMPTS), torch.tensor(tokens)], 1)


@pytest.mark.parametrize("family", BFLOAT16)
def test_in_bfloat16_vllm_serves_transformers_tokens_to_bfloat16s_rounding(
    family, references, served
):
    """Each row as transformers' until a step whose top-2 gap is within
    bfloat16's rounding (a tie either engine may break), if any."""
    result, (tokens, logprobs, gaps) = (
        served[0][f"{family}-bfloat16"],
        references[family]["bfloat16"],
    )
    assert "error" not in result, result.get("error")
    for i, row in enumerate(tokens):
        differs = [s for s, (a, b) in enumerate(zip(row, result["tokens"][i])) if a != b]
        same = differs[0] if differs else len(row)
        if differs:
            assert gaps[i, same] <= BFLOAT16_TIE, (
                f"{family}, prompt {i}: step {same} differs where transformers' top-2 gap is "
                f"{gaps[i, same]:.1f} units of 2^-8 of the logit (a tie is <= {BFLOAT16_TIE:g})"
            )
        gap = (torch.tensor(result["logprobs"][i][:same]) - logprobs[i, :same]).abs().max()
        assert same == 0 or gap < BFLOAT16_TOLERANCE, f"{family}: log-probabilities {gap:.2e} apart"


@pytest.mark.parametrize("family", SERVED)
def test_the_control_b_zeroed_gives_other_tokens(family, references):
    """Without b transformers generates otherwise: vLLM serving a model
    without its b (or lambda ignored) would fail the tests here."""
    reference = references[family]
    assert reference["zeroed"] != reference["tokens"]
    assert reference["scaled"][0.0] != reference["tokens"]
    assert reference["scaled"][0.5] != reference["tokens"]


@pytest.mark.parametrize("family", SERVED)
def test_lambda_b_per_request_equals_transformers_bias_scale_processor(family, references, served):
    results, _ = served
    result, reference = results[family], references[family]
    assert "error" not in result, result.get("error")
    assert result["scaled"]["1.0"] == result["tokens"]  # lambda = 1: the model as trained
    for scale in SCALES:
        assert result["scaled"][str(scale)] == reference["scaled"][scale], scale


@pytest.mark.parametrize("family", SERVED)
def test_lambda_b_per_request_serves_log_softmax_of_g_w_phi_plus_lambda_b(
    family, references, served
):
    """b is off the prior (natural_bias_model), so lambda scaling log p instead
    of b, or any other row, shows. At each step of vLLM's own greedy run its
    log p (after its logits processors) is log_softmax(g W phi + lambda b)
    computed by hand within float32_margin, and its token that row's argmax
    to within that margin (a tie of float32 logits either engine may break)."""
    result, model = served[0][family], references[family]["model"]
    assert "error" not in result, result.get("error")
    for scale in SCALES:
        tokens = torch.tensor(result["scaled"][str(scale)])
        ids = torch.cat([torch.tensor(PROMPTS), tokens], 1)[:, :-1]
        log_p = torch.log_softmax(logits_by_hand(model, ids, scale), -1)[:, -STEPS:]
        expected = log_p.gather(-1, tokens[..., None])[..., 0]
        gap = (torch.tensor(result["scaled_logprobs"][str(scale)]) - expected).abs().max().item()
        margin = float32_margin(model, ids, scale)
        assert gap < margin, f"{family}, lambda {scale}: log p {gap:.2e} from g W phi + lambda b"
        behind = (log_p.max(-1).values - expected).max().item()
        assert behind < margin, f"{family}, lambda {scale}: a token {behind:.2e} below the top"


@pytest.mark.parametrize("family", REFUSED)
def test_a_family_vllm_has_no_class_for_is_refused_in_our_one_line(family, served):
    """The error vLLM raises, asked for the family when it reads the model's
    architecture (before any engine starts), is natbias's line naming the
    architecture and what to do, not vLLM's "failed to be inspected"."""
    refused = served[0][family]
    error = refused.get("error", "")
    stock = REFUSED[family][1]
    assert f"cannot serve a natural-bias {stock}: " in error, refused
    assert "natbias.hf" in error and "failed to be inspected" not in error, error


def test_a_lora_adapter_on_a_natural_bias_model_equals_transformers_with_it(references, served):
    """vLLM's LoRA (the natural-bias Llama's engine has it enabled) against
    transformers with the adapter merged; the adapter changes the tokens."""
    result, reference = served[0]["llama"], references["llama"]
    assert result["lora"] == reference["lora"]
    assert reference["lora"] != reference["tokens"]


def test_tensor_parallelism_2_equals_1(references, served):
    """The Llama on two processes (b and W split by the vocabulary): the
    tokens and log-probabilities of one (two float32 runs: float32_margin),
    lambda * b too."""
    one, two = served[0]["llama"], served[0]["llama-tp2"]
    assert "error" not in two, two.get("error")
    assert two["tokens"] == one["tokens"] and two["scaled"] == one["scaled"]
    gap = (torch.tensor(two["logprobs"]) - torch.tensor(one["logprobs"])).abs().max().item()
    assert gap < float32_margin(references["llama"]["model"], with_tokens(one["tokens"]))


# --- the OpenAI-compatible server ---------------------------------------------------------


def word_tokenizer():
    """A word-level tokenizer over the V ids (w3, w4, ...), saved with the
    model as a user's would be: the server reads it."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    names = {0: "<pad>", 1: "</s>", 2: "<s>"}
    vocabulary = {names.get(i, f"w{i}"): i for i in range(V)}
    word_level = Tokenizer(models.WordLevel(vocabulary, unk_token="w3"))
    return PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        pad_token="<pad>",
        eos_token="</s>",
        bos_token="<s>",
        unk_token="w3",
    )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url, body, timeout=300):
    """(status, JSON body) of a POST, error statuses included."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.fixture(scope="module")
def server(references, served, tmp_path_factory):
    """vLLM's OpenAI-compatible server (the module `vllm serve` starts: the
    CPU build's `vllm` command fails) on the saved Llama, on 127.0.0.1."""
    import time
    import urllib.request

    path = references["llama"]["path"]
    word_tokenizer().save_pretrained(path)
    work = tmp_path_factory.mktemp("vllm_server")
    port = free_port()
    env = dict(vllm_environment(work), VLLM_ENABLE_V1_MULTIPROCESSING="1")
    command = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
        "--served-model-name", "natbias-llama", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "64", "--max-num-seqs", "64", "--enforce-eager",
        "--kv-cache-memory-bytes", str(KV_CACHE),
    ]  # fmt: skip
    log = open(work / "server.log", "w")
    process = subprocess.Popen(command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            assert process.poll() is None, (work / "server.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                assert time.time() < deadline, "the server did not start in 600 s"
                time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def completion(prompt, **options):
    body = dict(model="natbias-llama", prompt=prompt, max_tokens=STEPS, temperature=0.0)
    body.update(ignore_eos=True, return_token_ids=True, **options)
    return body


def test_the_server_answers_64_concurrent_completions_with_the_offline_tokens(server, served):
    """64 at once, a quarter of them with lambda = 0.5 (vllm_xargs)."""
    from concurrent.futures import ThreadPoolExecutor

    offline = served[0]["llama"]
    bodies = [
        completion(
            PROMPTS[i % len(PROMPTS)],
            **({"vllm_xargs": {"natbias_bias_scale": 0.5}} if i % 4 == 3 else {}),
        )
        for i in range(64)
    ]
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda body: post(f"{server}/v1/completions", body), bodies))
    for i, (status, answer) in enumerate(answers):
        assert status == 200, answer
        expected = offline["scaled"]["0.5"] if i % 4 == 3 else offline["tokens"]
        assert answer["choices"][0]["token_ids"] == expected[i % len(PROMPTS)], i


def test_a_bad_request_gets_the_servers_error_and_the_server_goes_on(server, served):
    too_long = completion(PROMPTS[0] * 20)  # 120 tokens, the model takes 64
    status, answer = post(f"{server}/v1/completions", too_long)
    assert status == 400 and "error" in answer, answer
    status, answer = post(f"{server}/v1/completions", completion(PROMPTS[0], max_tokens="many"))
    assert status == 400, answer
    bad_scale = completion(PROMPTS[0], vllm_xargs={"natbias_bias_scale": "half"})
    status, answer = post(f"{server}/v1/completions", bad_scale)
    assert status == 400 and "natbias_bias_scale" in json.dumps(answer), answer
    status, answer = post(f"{server}/v1/completions", completion(PROMPTS[1]))
    assert status == 200 and answer["choices"][0]["token_ids"] == served[0]["llama"]["tokens"][1]
