"""A strict JSON schema of what Grafana reads when it imports a dashboard (its JSON model,
schemaVersion 39 and later), for tests/ops/test_grafana_dashboards.py.

Grafana publishes its dashboard model as CUE and as generated code, not as a JSON
schema that validates: the ``grafana-foundation-sdk`` package's Python models
(``models/dashboard.py``, ``models/prometheus.py``) read any dict and drop what they do
not know. So the schema is ours, with the field names those models (10.1.0) list for
``Dashboard``, ``Panel``, ``RowPanel``, ``GridPos``, ``VariableModel``,
``FieldConfigSource`` and Prometheus' ``Dataquery``: a misspelt field, which Grafana
would drop silently, fails here. Where the models allow more than gpulab's dashboards
need (library panels, snapshots, repeats), the schema is narrower on purpose.
"""

from __future__ import annotations

#: The panel types of Grafana's core (``public/app/plugins/panel``) that a dashboard
#: without plugins can use.
CORE_PANELS = [
    "timeseries",
    "stat",
    "gauge",
    "bargauge",
    "table",
    "barchart",
    "heatmap",
    "histogram",
    "piechart",
    "state-timeline",
    "status-history",
    "text",
]

_DATASOURCE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"type": "string", "minLength": 1}},
}

_GRID_POS = {
    "type": "object",
    "additionalProperties": False,
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
        "static": {"type": "boolean"},
    },
}

#: Prometheus' query (its ``Dataquery``).
_TARGET = {
    "type": "object",
    "additionalProperties": False,
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "datasource": _DATASOURCE,
        "legendFormat": {"type": "string"},
        "instant": {"type": "boolean"},
        "range": {"type": "boolean"},
        "exemplar": {"type": "boolean"},
        "editorMode": {"enum": ["code", "builder"]},
        "format": {"enum": ["time_series", "table", "heatmap"]},
        "interval": {"type": "string"},
        "intervalFactor": {"type": "integer"},
        "hide": {"type": "boolean"},
        "queryType": {"type": "string"},
    },
}

_FIELD_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "required": ["defaults", "overrides"],
    "properties": {
        "defaults": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "displayName": {"type": "string"},
                "description": {"type": "string"},
                "unit": {"type": "string"},
                "decimals": {"type": "integer", "minimum": 0},
                "min": {"type": "number"},
                "max": {"type": "number"},
                "mappings": {"type": "array"},
                "thresholds": {"type": "object"},
                "color": {"type": "object"},
                "links": {"type": "array"},
                "noValue": {"type": "string"},
                "custom": {"type": "object"},
            },
        },
        "overrides": {"type": "array"},
    },
}

_PANEL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "type", "title", "gridPos", "datasource", "targets"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": CORE_PANELS},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "datasource": _DATASOURCE,
        "gridPos": _GRID_POS,
        "targets": {"type": "array", "minItems": 1, "items": _TARGET},
        "fieldConfig": _FIELD_CONFIG,
        "options": {"type": "object"},
        "transformations": {"type": "array"},
        "links": {"type": "array"},
        "interval": {"type": "string"},
        "maxDataPoints": {"type": "integer"},
        "timeFrom": {"type": "string"},
        "timeShift": {"type": "string"},
        "transparent": {"type": "boolean"},
        "pluginVersion": {"type": "string"},
    },
}

_ROW = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "type", "title", "gridPos", "collapsed", "panels"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"const": "row"},
        "title": {"type": "string", "minLength": 1},
        "collapsed": {"type": "boolean"},
        "gridPos": _GRID_POS,
        # An open row's panels follow it at the top level; a collapsed one keeps them here.
        "panels": {"type": "array", "items": _PANEL},
    },
}

_VARIABLE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "type"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "label": {"type": "string"},
        "description": {"type": "string"},
        "type": {"enum": ["query", "datasource", "custom", "interval", "constant", "textbox"]},
        "datasource": _DATASOURCE,
        "query": {"type": "string", "minLength": 1},
        "current": {"type": "object"},
        "options": {"type": "array"},
        "hide": {"enum": [0, 1, 2]},
        "refresh": {"enum": [0, 1, 2]},
        "regex": {"type": "string"},
        "sort": {"type": "integer", "minimum": 0, "maximum": 8},
        "multi": {"type": "boolean"},
        "includeAll": {"type": "boolean"},
        "allValue": {"type": "string"},
        "skipUrlSync": {"type": "boolean"},
    },
    # A datasource variable names its plugin; a query variable asks a data source.
    "allOf": [
        {
            "if": {"properties": {"type": {"const": "datasource"}}},
            "then": {"required": ["query"], "properties": {"query": {"const": "prometheus"}}},
        },
        {
            "if": {"properties": {"type": {"const": "query"}}},
            "then": {"required": ["query", "datasource"]},
        },
    ],
}

DASHBOARD = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Grafana dashboard (the parts an import reads)",
    "type": "object",
    "additionalProperties": False,
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        # Grafana refuses a uid over 40 characters or with other characters.
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "schemaVersion": {"type": "integer", "minimum": 39},
        "version": {"type": "integer", "minimum": 0},
        "time": {
            "type": "object",
            "additionalProperties": False,
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "timepicker": {"type": "object"},
        "timezone": {"type": "string"},
        "refresh": {"type": "string", "pattern": "^([0-9]+[smhd])?$"},
        "fiscalYearStartMonth": {"type": "integer", "minimum": 0, "maximum": 11},
        "liveNow": {"type": "boolean"},
        "weekStart": {"type": "string"},
        "annotations": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"list": {"type": "array"}},
        },
        "links": {"type": "array"},
        "templating": {
            "type": "object",
            "additionalProperties": False,
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": _VARIABLE}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "if": {"properties": {"type": {"const": "row"}}},
                "then": _ROW,
                "else": _PANEL,
            },
        },
        # An instance's own: an exported dashboard's numeric id would clash on import.
        "id": {"type": "null"},
    },
}
