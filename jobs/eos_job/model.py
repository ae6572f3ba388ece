"""The base of every resource model: camelCase on the wire, unknown fields refused."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, SerializationInfo, SerializerFunctionWrapHandler, model_serializer
from pydantic.alias_generators import to_camel

WIRE = {"wire": True}   # the serialization context of Model.wire


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True)

    def wire(self) -> dict:
        """The camelCase form, as stored in the API server and written for the driver: unset optional fields
        left out (a runtime one minor version older refuses fields it does not know, null ones too), an explicit
        null kept where the field's default is not null (``fsGroup: null`` is not its default)."""
        return self.model_dump(by_alias=True, mode="json", context=WIRE)

    @model_serializer(mode="wrap")
    def _wire_form(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo):   # unannotated: the JSON schema stays the fields
        data = handler(self)
        if info.context is WIRE:
            for name, field in type(self).model_fields.items():
                key = (field.serialization_alias or field.alias or name) if info.by_alias else name
                if field.default is None and key in data and data[key] is None:
                    del data[key]
        return data
