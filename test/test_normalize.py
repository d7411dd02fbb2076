"""Tests of moss_tts_node.text.normalize: each rule of docs/model.md ("Text clean-up"), protected spans, idempotence."""

from __future__ import annotations

import random
import re

import pytest

from moss_tts_node.text.normalize import _normalize_once, normalize_text

# (input, expected): at least one case per rule of docs/model.md, "Text clean-up".
RULE_CASES = [
    # characters
    pytest.param("第一行\r\n第二行\r第三行", "第一行。第二行。第三行", id="crlf-and-cr-unified"),
    pytest.param("这是\u3000一段文本", "这是一段文本", id="ideographic-space-to-space"),
    pytest.param("Hello\u3000world", "Hello world", id="ideographic-space-in-latin"),
    pytest.param("zero\u200bwidth\u200c\u200d\ufeff text", "zerowidth text", id="zero-width-removed"),
    pytest.param("bell\x07 and\x00 null\x1b", "bell and null", id="control-chars-removed"),
    pytest.param("soft\u00adhyphen \u202aembedded\u202c", "softhyphen embedded", id="format-chars-removed"),
    pytest.param("a\tb\u00a0c", "a b c", id="tab-and-nbsp-to-space"),
    # markdown
    pytest.param(
        "详情见 [release note](https://github.com/example/release)",
        "详情见 release note https://github.com/example/release",
        id="markdown-link",
    ),
    pytest.param(
        'See [the docs](https://docs.example.com/a "Docs") now.',
        "See the docs https://docs.example.com/a now.",
        id="markdown-link-with-title",
    ),
    pytest.param("# I made a free open source app", "I made a free open source app", id="heading"),
    pytest.param("## Install ##", "Install", id="heading-closing-hashes"),
    pytest.param("> Note: keep it short", "Note: keep it short", id="block-quote"),
    pytest.param("> > nested quote", "nested quote", id="nested-quote"),
    pytest.param("- 修复 .map 泄露\n- 发布 v2.3.1", "修复 .map 泄露。发布 v2.3.1", id="dash-bullets"),
    pytest.param("* first\n+ second", "first。second", id="star-and-plus-bullets"),
    pytest.param("1. 安装依赖\n2. 运行测试\n3. 发布 v2.3.1", "安装依赖。运行测试。发布 v2.3.1", id="numbered-dot"),
    pytest.param("1) first\n2) second", "first。second", id="numbered-paren"),
    pytest.param("第一行\n\n\n第二行\n  \n第三行", "第一行。第二行。第三行", id="empty-lines-dropped"),
    pytest.param("Done.\nNext line", "Done. Next line", id="join-after-ascii-stop-with-space"),
    pytest.param("好的。\n下一步", "好的。下一步", id="join-after-cjk-stop-with-nothing"),
    pytest.param("**Bold** and `code`", "Bold and code", id="bold-and-backticks-removed"),
    pytest.param("```python\nprint(1)\n```", "print(1)", id="code-fence-lines-dropped"),
    pytest.param("above\n\n---\n\nbelow", "above。below", id="horizontal-rule-dropped"),
    pytest.param("| a | b |\n|---|---|\n| 1 | 2 |", "a，b。1，2", id="table-rows"),
    pytest.param("- [ ] buy milk\n- [x] done", "buy milk。done", id="task-boxes-dropped"),
    # spacing
    pytest.param("This   is   a   test.", "This is a test.", id="latin-space-runs-collapsed"),
    pytest.param("这 是 一 段  含有多种空白的文本。", "这是一段含有多种空白的文本。", id="no-space-between-cjk"),
    pytest.param("2026 年 3 月 31 日", "2026年3月31日", id="no-space-between-cjk-and-digits"),
    pytest.param("这是Anthropic的npm包", "这是 Anthropic 的 npm 包", id="one-space-cjk-latin-inserted"),
    pytest.param("这是   Anthropic   的包", "这是 Anthropic 的包", id="one-space-cjk-latin-collapsed"),
    pytest.param("处理app.js.map文件", "处理 app.js.map 文件", id="one-space-cjk-protected"),
    pytest.param("详见https://x.com/a看看", "详见 https://x.com/a 看看", id="one-space-cjk-url"),
    pytest.param("你好 ， 世界 。", "你好，世界。", id="no-space-around-cjk-punctuation"),
    pytest.param("Hello , world ; ok ! really ?", "Hello, world; ok! really?", id="no-space-before-ascii-punct"),
    # structural brackets and titles
    pytest.param("【公告】今天 20:00 维护", "公告。今天20:00维护", id="structural-bracket-at-start"),
    pytest.param("〖重磅〗消息", "重磅。消息", id="structural-bracket-lenticular"),
    pytest.param("『特别提醒』「不要外传」", "特别提醒。不要外传", id="structural-bracket-chain"),
    pytest.param("好的。【注意】明天下雨", "好的。注意。明天下雨", id="structural-bracket-after-stop"),
    pytest.param("【公告】：今天休息", "公告：今天休息", id="structural-bracket-before-punct"),
    pytest.param("他说「你好」。", "他说「你好」。", id="embedded-quote-kept"),
    pytest.param("《新闻联播》", "新闻联播", id="standalone-title-unwrapped"),
    pytest.param("〖重磅〗《新品发布》——现在开始！", "重磅。新品发布。现在开始！", id="standalone-title-before-dash"),
    pytest.param("我喜欢《哈姆雷特》这本书。", "我喜欢《哈姆雷特》这本书。", id="embedded-title-kept"),
    # arrows and dashes
    pytest.param("请求接入 -> 身份判定 -> 域服务处理", "请求接入，身份判定，域服务处理", id="ascii-arrow"),
    pytest.param("A->B=>C<-D", "A，B，C，D", id="ascii-arrows-without-spaces"),
    pytest.param("配置中心→推理编排⇒运行时", "配置中心，推理编排，运行时", id="unicode-arrows"),
    pytest.param("x <= 5 and y >= 3", "x <= 5 and y >= 3", id="comparisons-are-not-arrows"),
    pytest.param("今天维护——预计三十分钟", "今天维护。预计三十分钟", id="cjk-dash"),
    pytest.param("Wait -- what", "Wait。what", id="ascii-dash"),
    pytest.param("Wait—what", "Wait—what", id="single-em-dash-kept"),
    # repeated punctuation
    pytest.param("这个包也发上去了......太离谱了", "这个包也发上去了。太离谱了", id="ascii-ellipsis"),
    pytest.param("今天下雨了……", "今天下雨了。", id="cjk-ellipsis"),
    pytest.param("结束了。。。", "结束了。", id="repeated-full-stops"),
    pytest.param("嗯，，好的", "嗯，好的", id="repeated-commas"),
    pytest.param("太离谱了！！！", "太离谱了！", id="repeated-cjk-bangs"),
    pytest.param("Wow!!", "Wow！", id="repeated-ascii-bangs"),
    pytest.param("Really??", "Really？", id="repeated-questions"),
    pytest.param("真的假的？？？！！！", "真的假的？！", id="mixed-cjk-question-bang"),
    pytest.param("What?!", "What？！", id="mixed-ascii-question-bang"),
    pytest.param("第一步 ->\n第二步", "第一步。第二步", id="comma-before-stop-dropped"),
]

# Spans that must come out exactly as they went in.
PROTECTED_CASES = [
    pytest.param("仓库地址是 https://github.com/instructkr/claude-code", id="url"),
    pytest.param("See https://example.com/a--b?x=1&y=...z for details.", id="url-with-dashes-and-dots"),
    pytest.param("联系邮箱：ops+tts@example.ai", id="email"),
    pytest.param("@Fried_rice 说这是 source map 暴露。", id="mention"),
    pytest.param("去 r/singularity 看讨论，或者问 u/spez。", id="reddit-names"),
    pytest.param("#张雪峰#张雪峰[话题]#张雪峰事件", id="hashtags-and-bracket"),
    pytest.param("别把 .env、.npmrc、.gitignore 提交上去。", id="dot-tokens"),
    pytest.param("请检查 bundle.min.js、package.json 和 app.js.map。", id="file-names"),
    pytest.param("Bug 的讨论可以精确到 v2.3.1 (Build 15)。", id="version"),
    pytest.param("3.0.0-rc.1 还不能上生产。", id="prerelease-version"),
    pytest.param("fabric-api-0.91.3+1.20.2.jar 需要单独下载。", id="jar-name"),
    pytest.param("[S1]你好。[S2]收到。", id="square-brackets-kept"),
    pytest.param("请模仿 {whisper} 的语气说“别出声”。", id="curly-brackets-kept"),
    pytest.param("Keep [a -> b -- c...] as is.", id="bracket-contents-untouched"),
]

UNCHANGED_CASES = [
    pytest.param("The quick brown fox jumps over the lazy dog.", id="plain-english"),
    pytest.param("Hello, world! How are you today? I'm fine; thanks.", id="english-punctuation"),
    pytest.param("今天天气很好，我们去公园散步吧。", id="plain-chinese"),
    pytest.param("你好！你吃饭了吗？", id="chinese-punctuation"),
    pytest.param("It costs $5.99, weighs 10 kg, and ships on 2024-05-01 at 20:00.", id="numbers-units-dates"),
    pytest.param("会议在2024年5月1日下午3点，预算1,000,000元，增长3.5%，气温-5°C。", id="chinese-numbers"),
    pytest.param("The robot moves at 1.5 m/s and turns 90° in 0.25 s.", id="units"),
    pytest.param("Café au lait, s'il vous plaît.", id="accented-latin"),
    pytest.param("안녕하세요 여러분", id="hangul-keeps-its-spaces"),
]

LLM_ANSWER = """\
## 如何重启机器人

好的！下面是**重启步骤**：

1. 打开 [控制面板](https://robot.local/panel)
2. 运行 `sudo systemctl restart moss-tts.service`
3. 检查日志 -> 确认没有报错……

> 注意：不要删除 .env 文件！！

---

| 步骤 | 耗时 |
|------|------|
| 重启 | 30s |

有问题请联系 ops@example.com 或 @robot_team。
"""

LLM_ANSWER_EXPECTED = (
    "如何重启机器人。好的！下面是重启步骤：打开控制面板 https://robot.local/panel。"
    "运行 sudo systemctl restart moss-tts.service。检查日志，确认没有报错。"
    "注意：不要删除 .env 文件！步骤，耗时。重启，30s。"
    "有问题请联系 ops@example.com 或 @robot_team。"
)

ENGLISH_LLM_ANSWER = """\
# Summary

Here's what I found:

* **Battery**: 87% -- fine
* **Motors** => all OK!!
* Next check: 2024-06-01

Let me know if you need more...
"""

ENGLISH_LLM_ANSWER_EXPECTED = (
    "Summary。Here's what I found: Battery: 87%。fine。Motors，all OK！"
    "Next check: 2024-06-01。Let me know if you need more。"
)

EMPTY_CASES = ["", "   ", "\n\n\t\u3000\n", "\u200b\ufeff", "---\n***\n", "# \n- \n> ", "```\n```"]

ALL_INPUTS = [
    *(case.values[0] for case in RULE_CASES),
    *(case.values[0] for case in PROTECTED_CASES),
    *(case.values[0] for case in UNCHANGED_CASES),
    LLM_ANSWER,
    ENGLISH_LLM_ANSWER,
    *EMPTY_CASES,
]


@pytest.mark.parametrize(("text", "expected"), RULE_CASES)
def test_rule(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize("text", PROTECTED_CASES)
def test_protected_spans_untouched(text: str) -> None:
    assert normalize_text(text) == text


@pytest.mark.parametrize("text", UNCHANGED_CASES)
def test_clean_text_unchanged(text: str) -> None:
    assert normalize_text(text) == text


def test_realistic_llm_markdown_answer() -> None:
    assert normalize_text(LLM_ANSWER) == LLM_ANSWER_EXPECTED


def test_realistic_english_llm_answer() -> None:
    assert normalize_text(ENGLISH_LLM_ANSWER) == ENGLISH_LLM_ANSWER_EXPECTED


@pytest.mark.parametrize("text", EMPTY_CASES)
def test_nothing_speakable_gives_empty_string(text: str) -> None:
    assert normalize_text(text) == ""


@pytest.mark.parametrize("text", ALL_INPUTS)
def test_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once


@pytest.mark.parametrize("text", ALL_INPUTS)
def test_one_pass_is_already_stable_on_ordinary_text(text: str) -> None:
    # normalize_text re-applies the pipeline until it is stable; for ordinary text the rules
    # alone must already get there, so that loop stays a safety net.
    once = _normalize_once(text)
    assert _normalize_once(once) == once


def test_idempotent_on_symbol_soup() -> None:
    rng = random.Random(20240501)
    alphabet = [*"ab Z9 .-_/:+@#*>`[](){}【】〖〗『』「」《》—…。，！？!?,;；：、中文かな\n\t\u3000\u200b|=<→"]
    alphabet += ["->", "--", "...", "http://a.b/c", "x@y.io", ".env", "v1.2", "1. ", "- ", "# ", "> "]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
        once = normalize_text(text)
        assert normalize_text(once) == once, text


def test_never_expands_numbers() -> None:
    text = "价格 100 元，3.5 kg，50%，2024-05-01，v1.2，#1，1/2，-3"
    out = normalize_text(text)
    for number in ("100", "3.5", "50%", "2024-05-01", "v1.2", "#1", "1/2", "-3"):
        assert number in out
    assert not any(word in out for word in ("一百", "hundred", "percent", "百分"))


@pytest.mark.parametrize(
    "text",
    [
        "[S1] Hello there!\n[S2] Hi.",
        "- [S1]: Hello\n- [S2]: **Yes**",
        "[S1]Wow!! Really?[S2]——好的",
        "> [S3]【公告】今天\n\n[S4]->[S5] ok",
    ],
)
def test_speaker_tags_are_never_cleaned_away(text: str) -> None:
    """A dialogue's turns reach the prompt as written: every [S1]..[S5] stays, whole, in its order."""
    tags = re.findall(r"\[S\d\]", text)
    assert re.findall(r"\[S\d\]", normalize_text(text)) == tags
