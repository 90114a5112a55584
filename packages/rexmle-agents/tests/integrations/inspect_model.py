"""A scripted tool-calling model registered with Inspect as ``rexmle-test/script`` (imported by the Inspect tests, and
by the process the command-line test starts, before Inspect's command line runs)."""

from __future__ import annotations

from typing import Any

from inspect_ai.model import ChatMessage, GenerateConfig, ModelAPI, ModelOutput, ModelUsage, modelapi
from inspect_ai.tool import ToolChoice, ToolInfo

SCRIPT_API = "rexmle-test"


@modelapi(name=SCRIPT_API)
class ScriptedToolModel(ModelAPI):
    """Calls the bash tool with each of ``commands`` in turn, then the submit tool, then answers in text; usage is
    reported (so Inspect counts no tokens itself, which would need a tokenizer download)."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig = GenerateConfig(), commands: list[str] | None = None,
                 **model_args: Any) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        self.commands = list(commands or [])

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice,
                       config: GenerateConfig) -> ModelOutput:
        turn = sum(1 for message in input if message.role == "assistant")
        names = {t.name for t in tools}
        if turn < len(self.commands):
            output = ModelOutput.for_tool_call(self.model_name, "bash", {"command": self.commands[turn]},
                                               content=f"step {turn + 1}: running a command")
        elif turn == len(self.commands) and "submit" in names:
            output = ModelOutput.for_tool_call(self.model_name, "submit", {"answer": "submission written"},
                                               content="done")
        else:
            output = ModelOutput.from_content(self.model_name, "The submission is written.")
        output.usage = ModelUsage(input_tokens=100 + turn, output_tokens=20, total_tokens=120 + turn)
        return output


