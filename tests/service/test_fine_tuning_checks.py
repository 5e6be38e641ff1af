"""What the fine-tuning API checks before a job is queued (a training file's lines,
the hyperparameters), and what the SFT loop learns from an example: the assistant's
reply only. Pure functions: no service."""

from __future__ import annotations

import json
import os

import pytest

from gpulab.service.endpoints.fine_tuning import check_hyperparameters
from gpulab.service.endpoints.fine_tuning_files import check_training_file
from gpulab.service.endpoints.openai_errors import OpenAIError

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def lines(*rows) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def refusal(data: bytes) -> str:
    with pytest.raises(OpenAIError) as e:
        check_training_file(data)
    assert e.value.status == 400
    return str(e.value)


def test_a_training_file_counts_its_examples_and_skips_blank_lines():
    assert check_training_file(lines(GOOD, "", GOOD)) == 2


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ('{"messages": [', "line 2: not JSON"),
        ({"prompt": "x", "completion": "y"}, 'line 2: no "messages" list'),
        ({"messages": []}, 'line 2: "messages" is empty'),
        ({"messages": [{"role": "robot", "content": "x"}]}, "line 2: message 1 has role 'robot'"),
        ({"messages": [{"role": "user", "content": 3}]}, "line 2: message 1 (user) has no string"),
        ({"messages": [{"role": "user", "content": "x"}]}, "line 2: no assistant message"),
    ],
)
def test_a_bad_line_is_named_by_its_number_with_the_shape_to_use(bad, says):
    message = refusal(lines(GOOD, bad, GOOD))
    assert message.startswith(f"training file {says}")
    assert '{"messages": [{"role": "user"' in message  # the fix, in the same line


def test_bytes_that_are_not_utf8_are_named_by_line_and_an_empty_file_is_refused():
    assert refusal(lines(GOOD) + b"\xff\n").startswith("training file line 2: not UTF-8")
    assert "no examples" in refusal(b"\n\n")


def test_hyperparameters_fill_auto_and_refuse_what_they_cannot_use():
    assert check_hyperparameters({}) == {
        "n_epochs": 3,
        "batch_size": 4,
        "learning_rate_multiplier": 1.0,
    }
    got = check_hyperparameters(
        {"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}}
    )
    assert got["n_epochs"] == 2
    for bad, param in [
        ({"n_epochs": 0}, "hyperparameters.n_epochs"),
        ({"batch_size": 2.5}, "hyperparameters.batch_size"),
        ({"learning_rate_multiplier": "fast"}, "hyperparameters.learning_rate_multiplier"),
        ({"n_epochs": True}, "hyperparameters.n_epochs"),
        ({"warmup": 3}, "hyperparameters"),
    ]:
        with pytest.raises(OpenAIError) as e:
            check_hyperparameters({"hyperparameters": bad})
        assert (e.value.status, e.value.param) == (400, param)
    with pytest.raises(OpenAIError) as e:
        check_hyperparameters({"method": {"type": "dpo"}})
    assert e.value.param == "method"


def test_the_loss_is_taken_on_the_assistant_replies_only():
    from tiny_lm import tiny_tokenizer

    from gpulab.training.sft import tokenize

    tok = tiny_tokenizer()
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Fine."},
    ]
    ids, labels = tokenize(tok, chat, max_len=512)
    assert tok.decode(ids) == tok.apply_chat_template(chat, tokenize=False)
    learned = [t for t in labels if t != -100]
    assert tok.decode(learned) == "Hi.</s>Fine.</s>"
    short, _ = tokenize(tok, chat, max_len=5)
    assert len(short) == 5


def test_an_adapter_joins_the_model_archive_the_service_unpacks_and_the_replica_loads(tmp_path):
    """The new version's archive: the endpoint's model folder with the adapter added,
    accepted by the upload's checks and loaded beside the base by the model loader."""
    from peft import LoraConfig, get_peft_model
    from tiny_lm import tiny_llama

    from gpulab.service.endpoints.fine_tuning_publish import ADAPTER_FILES, pack_with_adapter
    from gpulab.service.endpoints.model_archive import unpack_model
    from gpulab.serving.llm_export import load_causal_lm, save_causal_lm

    model, tok = tiny_llama()
    served = tmp_path / "served"
    save_causal_lm(model, tok, str(served), max_model_len=64, max_num_seqs=2)
    lora = get_peft_model(tiny_llama()[0], LoraConfig(r=2, target_modules="all-linear"))
    lora.save_pretrained(str(tmp_path / "lora"), safe_serialization=True)
    files = {n: (tmp_path / "lora" / n).read_bytes() for n in ADAPTER_FILES}

    (tmp_path / "v2").mkdir()
    (tmp_path / "v3").mkdir()
    pack_with_adapter(str(served), "pw-1", files, str(tmp_path / "v2.tar.gz"))
    card = unpack_model(str(tmp_path / "v2.tar.gz"), str(tmp_path / "v2"), 2**30)
    assert card["adapters"] == ["pw-1"]
    _, _, loaded = load_causal_lm(str(tmp_path / "v2"), device="cpu")
    assert loaded["adapters"] == ["pw-1"]
    # A second adapter keeps the first (each fine-tune adds to what is served).
    pack_with_adapter(str(tmp_path / "v2"), "pw-2", files, str(tmp_path / "v3.tar.gz"))
    card = unpack_model(str(tmp_path / "v3.tar.gz"), str(tmp_path / "v3"), 2**30)
    assert card["adapters"] == ["pw-1", "pw-2"]


def test_an_adapter_over_the_sites_model_size_is_refused_before_it_is_read_whole(tmp_path):
    """The ranks may write any amount in out/; the service holds the adapter in memory."""
    from gpulab.backend.jobdir import JobDir
    from gpulab.service.endpoints.fine_tuning import adapter_files
    from gpulab.service.endpoints.fine_tuning_publish import PublishFailed

    jd = JobDir(str(tmp_path), "ft1")
    os.makedirs(jd.p("out"))
    (tmp_path / "ft1" / "out" / "adapter_config.json").write_text("{}")
    with open(jd.p("out", "adapter_model.safetensors"), "wb") as f:
        f.truncate(64 << 30)  # sparse: no disk, 64 GiB to whoever reads it whole
    with pytest.raises(PublishFailed, match="over 1 MiB, the site's largest model"):
        adapter_files(jd, 1)
    with open(jd.p("out", "adapter_model.safetensors"), "wb") as f:
        f.write(b"w" * 1000)
    assert adapter_files(jd, 1) == {
        "adapter_config.json": b"{}",
        "adapter_model.safetensors": b"w" * 1000,
    }
    # The config is read in the same thread and held to 1 MiB whatever the model's cap
    # (it was parsed on the service's event loop, up to the model's size).
    with open(jd.p("out", "adapter_config.json"), "wb") as f:
        f.truncate(64 << 30)
    with pytest.raises(PublishFailed, match="more than an adapter's config holds"):
        adapter_files(jd, 4096)
    (tmp_path / "ft1" / "out" / "adapter_config.json").write_text("{not json")
    with pytest.raises(PublishFailed, match="not JSON"):
        adapter_files(jd, 4096)


def test_a_users_training_files_are_held_to_the_quota_and_deleting_gives_room_back(tmp_path):
    """Without a quota, POST /v1/files of the upload size again and again filled the
    service's disk (its databases' too)."""
    from tornado.httputil import HTTPFile

    from gpulab.db.engine import make_engine
    from gpulab.db.fine_tuning import FineTuningStore
    from gpulab.service.auth import Identity
    from gpulab.service.endpoints.fine_tuning_files import TrainingFiles

    store = FineTuningStore(make_engine(f"sqlite:///{tmp_path}/ft.sqlite"))
    files = TrainingFiles(store, str(tmp_path / "files"), quota_mib=1)
    alice, bob = Identity("alice", "user"), Identity("bob", "user")
    example = lines(GOOD)
    body = example * ((600 << 10) // len(example))  # 0.6 MiB of examples
    upload = HTTPFile(filename="train.jsonl", body=body, content_type="application/jsonl")
    first = files.create(alice, upload, "fine-tune")
    # The route asks this before it parses the next upload: refused unread.
    with pytest.raises(OpenAIError, match="hold 0.6 MiB of your 1 MiB"):
        files.check_quota(alice, len(body))
    with pytest.raises(OpenAIError) as e:
        files.create(alice, upload, "fine-tune")
    assert e.value.status == 413
    assert "your training files hold 0.6 MiB of your 1 MiB" in str(e.value)
    assert len(os.listdir(tmp_path / "files")) == 1  # nothing of the refused one kept
    files.create(bob, upload, "fine-tune")  # bob's quota is his own
    files.delete(alice, first["id"])
    files.create(alice, upload, "fine-tune")
    # A file that fits exactly is not refused for its multipart envelope.
    carol = Identity("carol", "user")
    files.check_upload(carol, (1 << 20) + 300)
    with pytest.raises(OpenAIError, match="storage_quota_exceeded|your training files"):
        files.check_upload(carol, (1 << 20) + (64 << 10) + 1)


async def test_a_training_file_is_sent_a_chunk_at_a_time(tmp_path):
    """A download held the whole file (up to the owner's 1 GiB quota) in the service's
    memory, once per download running."""
    from gpulab.service.endpoints.file_answer import CHUNK_BYTES, FileAnswer

    class Reply:
        started = False

        def __init__(self):
            self.headers, self.writes = {}, []

        async def start(self, status, headers):
            self.started, self.status, self.headers = True, status, headers

        async def write(self, data):
            self.writes.append(data)

    data = os.urandom(2 * CHUNK_BYTES + 12345)
    (tmp_path / "f.jsonl").write_bytes(data)
    reply = Reply()
    await FileAnswer(str(tmp_path / "f.jsonl")).send(reply, 200, "application/jsonl")
    assert reply.headers["Content-Length"] == str(len(data))
    assert [len(w) for w in reply.writes] == [CHUNK_BYTES, CHUNK_BYTES, 12345]
    assert b"".join(reply.writes) == data
    with pytest.raises(OpenAIError) as e:
        await FileAnswer(str(tmp_path / "gone.jsonl"), "no file file-1").send(Reply(), 200, "x")
    assert e.value.status == 404 and "no file file-1" in str(e.value)
