"""hamid.model"""
