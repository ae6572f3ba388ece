"""The base of every resource model: camelCase on the wire, unknown fields refused."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True)

    def wire(self) -> dict:
        """The camelCase form, as stored in the API server."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
